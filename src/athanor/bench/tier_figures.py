"""The tier benchmark's figures, from its rows (one per candidate: its fast- and slow-tier verdicts).

- Spearman rank correlation (SciPy) of fast- against slow-tier median speedups, over the candidates timed on
  both tiers (those rejected before timing on either have no speedup to rank);
- misses: candidates the fast tier's screen did not forward (`worth_confirming`) that the slow tier accepted,
  and whether one of them is the slow tier's best (the candidate the slow tier would have crowned);
- equal budget, replayed from the measured wall times of the evaluations in proposal order: "fast + slow"
  screens every candidate on the fast tier and confirms, best projected cost first, those it forwarded, keeping
  what `athanor compile` keeps for confirming (`replay_reserve`); "slow only" evaluates candidates on the slow
  tier until the budget is spent. Each strategy is charged once the start of the engines it uses, as one run
  pays it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from athanor.evaluate import EvaluateConfig, Verdict
from athanor.evaluate.timing import worth_confirming
from athanor.loop.config import CompileConfig
from athanor.loop.reserve import reserve_from
from athanor.store import EvaluationRecord

NOT_RUN = "not run"
"""The slow-tier stage of a candidate past `--slow-first` that no replay needed confirmed."""

STARTUP_FILE = "startup.json"
"""In the run directory: each call's measured start of each tier's engines (seconds), a list of
{"device", "fast", "slow"}; the replay charges a strategy the median of its tiers' once."""


def row(candidate_id: str, description: str, fast: EvaluationRecord, slow: EvaluationRecord | None) -> dict[str, Any]:
    """One candidate's fast and slow verdicts, from the store's records (so a resumed run rebuilds them);
    `slow` None: not evaluated on the slow tier (stage `NOT_RUN`, figures NaN, accepted None).
    `fast_forwarded`: the fast tier's screen sends it to the slow tier, as `athanor compile` decides."""
    forwarded = worth_confirming(Verdict.from_dict(fast.figures), EvaluateConfig.margin)

    def fields(ev: EvaluationRecord | None) -> tuple[tuple[str, Any], ...]:
        if ev is None:
            return (("accepted", None), ("stage", NOT_RUN), ("reason", ""), *((k, math.nan) for k in (
                "speedup", "ci_low", "ci_high", "gpu_s_per_1k", "wall_s")))
        return (("accepted", ev.accepted), ("stage", ev.stage), ("reason", ev.reason[:200]),
                ("speedup", ev.speedup), ("ci_low", ev.speedup_ci_low), ("ci_high", ev.speedup_ci_high),
                ("gpu_s_per_1k", ev.gpu_s_per_1k), ("wall_s", ev.wall_s))

    return {"candidate_id": candidate_id, "description": description, "fast_forwarded": forwarded,
            **{f"{tier}_{k}": v for tier, ev in (("fast", fast), ("slow", slow)) for k, v in fields(ev)}}


def on_slow(r: dict[str, Any]) -> bool:
    return bool(r["slow_stage"] != NOT_RUN)


def _startup_calls(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / STARTUP_FILE
    return json.loads(path.read_text()) if path.is_file() else []


def startup_figures(run_dir: Path) -> dict[str, float]:
    """Median start of each tier's engines over the calls so far (0 for a run recorded without them)."""
    calls = _startup_calls(run_dir)
    return {tier: float(np.median([c[tier] for c in calls])) if calls else 0.0 for tier in ("fast", "slow")}


def record_startup(run_dir: Path, device: str, fast_s: float, slow_s: float) -> None:
    """Add one call's measured engine starts to the run directory's `STARTUP_FILE`."""
    calls = [*_startup_calls(run_dir), {"device": device, "fast": fast_s, "slow": slow_s}]
    (run_dir / STARTUP_FILE).write_text(json.dumps(calls, indent=1))


def replay_reserve(rows: list[dict[str, Any]], config: CompileConfig, startup: dict[str, float] | None) -> float:
    """The reserve `athanor compile` keeps for confirming on a machine that has confirmed this model before
    (`athanor.loop.reserve`): from first confirmations that cost the slow tier's start plus one slow-tier evaluation
    timed to the end, as each of these rows' did. The device's default where no row has one yet."""
    start = (startup or {}).get("slow", 0.0)
    walls = [start + r["slow_wall_s"] for r in rows if r["slow_stage"] in ("accepted", "slow")]
    return config.reserve_s(reserve_from(walls))


def equal_budget(rows: list[dict[str, Any]], budget_s: float, reserve_s: float,
                 startup: dict[str, float] | None = None) -> dict[str, Any]:
    """Both strategies replayed from the measured wall times, candidates in proposal order, each charged once
    the start of the engines it uses (`startup`, seconds per tier), as one `athanor compile` is: fast + slow
    starts the fast tier's before screening and the slow tier's when it begins confirming, slow only the slow
    tier's. A replay that reaches a candidate with no slow-tier verdict stops there and names it in
    `needs_slow` (the run then evaluates it and replays again). `within_budget`: fast + slow ended by the
    budget (its first confirmation runs whatever it costs, so a reserve too small shows here)."""
    start = startup or {"fast": 0.0, "slow": 0.0}
    needs: list[str] = []
    spent, screened, accepted = start["fast"], 0, []
    for r in rows:  # fast + slow: screen until the reserve, then confirm the best accepted first
        if spent + r["fast_wall_s"] > budget_s - reserve_s:
            break
        spent += r["fast_wall_s"]
        screened += 1
        if r["fast_forwarded"]:
            accepted.append(r)
    winner, confirmed = None, 0
    spent += start["slow"] if accepted else 0.0
    for r in sorted(accepted, key=lambda r: r["fast_gpu_s_per_1k"]):
        if not on_slow(r):
            needs.append(r["candidate_id"])
            break
        if confirmed and spent + r["slow_wall_s"] > budget_s:  # the first confirmation always runs
            break
        spent += r["slow_wall_s"]
        confirmed += 1
        if r["slow_accepted"]:
            winner = r
            break
    slow_spent, slow_done, slow_winner = start["slow"], 0, None
    for r in rows:  # slow only
        if not on_slow(r):
            needs.append(r["candidate_id"])
            break
        if slow_done and slow_spent + r["slow_wall_s"] > budget_s:
            break
        slow_spent += r["slow_wall_s"]
        slow_done += 1
        if r["slow_accepted"] and (slow_winner is None or r["slow_gpu_s_per_1k"] < slow_winner["slow_gpu_s_per_1k"]):
            slow_winner = r
    return {
        "budget_s": budget_s, "reserve_s": reserve_s, "startup_s": start,
        "fast_slow": {"screened": screened, "confirmed": confirmed, "wall_s": spent, "within_budget": spent <= budget_s,
                      "winner": winner["candidate_id"] if winner else None,
                      "winner_slow_speedup": winner["slow_speedup"] if winner else None},
        "slow_only": {"evaluated": slow_done, "wall_s": slow_spent,
                      "winner": slow_winner["candidate_id"] if slow_winner else None,
                      "winner_slow_speedup": slow_winner["slow_speedup"] if slow_winner else None},
        "screened_ratio": screened / max(slow_done, 1),
        "needs_slow": needs,
    }


def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Rank correlation of the tiers' speedups, the fast tier's misses, and whether it missed the slow tier's best."""
    from scipy.stats import spearmanr

    timed = [r for r in rows if math.isfinite(r["fast_speedup"]) and math.isfinite(r["slow_speedup"])]
    rho = float(spearmanr([r["fast_speedup"] for r in timed], [r["slow_speedup"] for r in timed]).statistic) \
        if len(timed) >= 3 else float("nan")
    crowned = min((r for r in rows if r["slow_accepted"]), key=lambda r: r["slow_gpu_s_per_1k"], default=None)
    misses = [r["candidate_id"] for r in rows if r["slow_accepted"] and not r["fast_forwarded"]]
    return {"on_both": sum(on_slow(r) for r in rows), "timed_on_both": len(timed), "spearman": rho, "misses": misses,
            "slow_best": crowned["candidate_id"] if crowned else None,
            "slow_best_missed": bool(crowned and crowned["candidate_id"] in misses)}


def replayed(recorded: dict[str, Any], budget_s: float) -> dict[str, Any]:
    """The equal-budget replay of a recorded tiers record's rows (its measured walls and engine starts) under this
    code's rules: a figure of those measurements, not a new one."""
    rows, startup = recorded["candidates"], recorded["equal_budget"]["startup_s"]
    config = CompileConfig(model=recorded["model"], device=recorded["device"], budget_s=budget_s)
    return {"equal_budget": equal_budget(rows, budget_s, replay_reserve(rows, config, startup), startup),
            "equal_budget_default_reserve": equal_budget(rows, budget_s, config.reserve_s(), startup)}


def line(r: dict[str, Any]) -> str:
    """One candidate's row in a line: each tier's speedup, stage and wall time."""
    slow = f"slow x{r['slow_speedup']:.3f} ({r['slow_stage']}, {r['slow_wall_s']:.0f} s)" if on_slow(r) \
        else "slow not run"
    return (f"{r['candidate_id']} fast x{r['fast_speedup']:.3f} ({r['fast_stage']}, {r['fast_wall_s']:.0f} s)  {slow}  "
            f"{r['description'][:60]}")
