"""The tier benchmark's equal-budget replay (`athanor bench tiers`): what each strategy is charged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from athanor.bench import tier_figures as tiers


def _row(i: int, fast_s: float, slow_s: float, accepted: bool = True) -> dict[str, Any]:
    return {"candidate_id": f"c{i}", "fast_wall_s": fast_s, "fast_forwarded": accepted,
            "fast_gpu_s_per_1k": 100.0 - i, "slow_stage": "accepted" if accepted else "slow", "slow_wall_s": slow_s,
            "slow_accepted": accepted, "slow_gpu_s_per_1k": 100.0 - i, "slow_speedup": 1.0 + i / 100}


def test_each_strategy_pays_its_engines_start_once() -> None:
    rows = [_row(i, 10.0, 50.0) for i in range(40)]
    free = tiers.equal_budget(rows, 480.0, 120.0)
    assert (free["fast_slow"]["screened"], free["slow_only"]["evaluated"]) == (36, 9)
    charged = tiers.equal_budget(rows, 480.0, 120.0, {"fast": 25.0, "slow": 40.0})
    # The fast tier's start comes out of the screen's 360 s; the slow tier's out of the reserve (fast + slow)
    # and out of the budget (slow only).
    assert charged["fast_slow"]["screened"] == 33
    assert charged["fast_slow"]["wall_s"] == 25.0 + 33 * 10.0 + 40.0 + 50.0
    assert charged["slow_only"]["evaluated"] == 8 and charged["slow_only"]["wall_s"] == 40.0 + 8 * 50.0
    assert charged["startup_s"] == {"fast": 25.0, "slow": 40.0}


def test_the_slow_tier_start_is_charged_only_to_a_screen_that_confirms() -> None:
    rows = [_row(i, 10.0, 50.0, accepted=False) for i in range(40)]
    replay = tiers.equal_budget(rows, 480.0, 120.0, {"fast": 25.0, "slow": 40.0})
    assert replay["fast_slow"]["confirmed"] == 0 and replay["fast_slow"]["wall_s"] == 25.0 + 33 * 10.0


def test_startup_figures_are_the_median_over_calls(tmp_path: Path) -> None:
    assert tiers.startup_figures(tmp_path) == {"fast": 0.0, "slow": 0.0}  # a run recorded before
    for fast, slow in ((8.0, 10.0), (11.0, 14.0), (9.0, 12.0)):
        tiers.record_startup(tmp_path, "cuda", fast, slow)
    assert tiers.startup_figures(tmp_path) == {"fast": 9.0, "slow": 12.0}


def test_the_replay_keeps_what_compile_would_after_confirming_here() -> None:
    """The reserve is the slow tier's start plus a measured slow-tier evaluation (median, with the margin), not the
    constant: so the screen holds more, and fast + slow still ends within the budget."""
    from athanor.loop.config import CompileConfig
    from athanor.loop.reserve import MARGIN

    rows = [_row(i, 10.0, 50.0 + i % 3) for i in range(40)]
    startup = {"fast": 25.0, "slow": 40.0}
    config = CompileConfig(model="tiny-dense", device="cuda", budget_s=480.0)
    reserve = tiers.replay_reserve(rows, config, startup)
    assert reserve == MARGIN * (40.0 + 51.0)
    replay = tiers.equal_budget(rows, 480.0, reserve, startup)
    assert replay["fast_slow"]["screened"] > tiers.equal_budget(rows, 480.0, config.reserve_s(), startup)["fast_slow"]["screened"]
    assert replay["fast_slow"]["within_budget"]
    assert not tiers.equal_budget(rows, 480.0, 10.0, startup)["fast_slow"]["within_budget"]  # too small: runs over
    assert tiers.replay_reserve([_row(0, 10.0, 50.0) | {"slow_stage": "not run"}], config, startup) == 120.0


def test_a_recorded_run_is_replayed_under_the_current_rules(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from athanor.cli import main

    rows = [_row(i, 10.0, 50.0) for i in range(40)]
    recorded = tmp_path / "tiers.json"
    recorded.write_text(json.dumps({"model": "tiny-dense", "device": "cuda", "candidates": rows,
                                    "equal_budget": {"startup_s": {"fast": 25.0, "slow": 40.0}}}))
    out = tmp_path / "replayed.json"
    assert main(["bench", "tiers", "--replay", str(recorded), "--budget", "480", "--json", str(out)]) == 0
    assert capsys.readouterr().out.strip().endswith(f"-> {out}")
    record = json.loads(out.read_text())
    assert record["benchmark"] == "tiers-replay" and record["replayed"] == str(recorded)
    # What compile keeps after confirming here (the slow tier's start + one evaluation), and the default beside it.
    from athanor.loop.reserve import MARGIN

    assert record["equal_budget"]["reserve_s"] == pytest.approx(MARGIN * (40.0 + 50.0))
    assert record["equal_budget"]["fast_slow"]["screened"] == int((480.0 - MARGIN * 90.0 - 25.0) // 10.0)
    assert record["equal_budget_default_reserve"]["reserve_s"] == 120.0
    assert record["equal_budget_default_reserve"]["fast_slow"]["screened"] == 33
