"""A compile session confirms its best forward in the plan's layouts (`athanor.loop.layouts`): which contenders it
judges, what wins, what the winner's file records, and how a plan is read. The evaluator is a stand-in that judges
at once (the evaluator's own tests judge layouts for real: tests/unit/evaluate/test_layout_candidates.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from loop_doubles import Clock, StandInEvaluator

from athanor.cli import main
from athanor.engine.candidate import Candidate, baseline_candidate
from athanor.engine.candidate_dir import load_candidate_dir
from athanor.errors import ConfigError
from athanor.evaluate import Speedup, Verdict
from athanor.loop import CompileConfig
from athanor.loop.layouts import in_layout, plan_layouts
from athanor.loop.report import write_report
from athanor.loop.session import Session
from athanor.seams import declared_layout

ONE_DEVICE_ONLY = "# written for one device\n"


def _session(tmp_path: Path, clock: Clock) -> Session:
    config = CompileConfig(model="tiny-dense", traffic="preset:chat", budget_s=100.0, out_dir=tmp_path / "run",
                           max_seqs=8, max_seq_len=256, layouts=("tp2",))
    return Session(config, lambda line: None, clock=clock)


def _judge(candidate: Candidate, incumbent: Candidate) -> Verdict:
    """tp2 costs half the baseline's device-seconds; a forward written for one device fails in it."""
    if declared_layout(candidate.source) is None:
        return Verdict(candidate.id, incumbent.id, accepted=False, stage="slow", reason="stand-in: slower",
                       speedup=Speedup(0.9, 0.85, 0.95, 16), gpu_s_per_1k_requests=1.1)
    if ONE_DEVICE_ONLY in candidate.source:
        return Verdict(candidate.id, incumbent.id, accepted=False, stage="correctness", reason="stand-in: wrong")
    return Verdict(candidate.id, incumbent.id, accepted=True, stage="accepted", reason="", status="accepted",
                   speedup=Speedup(2.0, 1.9, 2.1, 16), gpu_s_per_1k_requests=0.5, incumbent_gpu_s_per_1k_requests=1.0,
                   wall_s=1.0, stages=(("slow", 1.0),))


def test_a_cheaper_layout_wins_and_the_winners_file_declares_it(tmp_path: Path) -> None:
    clock = Clock()
    session = _session(tmp_path, clock)
    slow = StandInEvaluator(verdict=_judge, clock=clock, cost_s=5.0)
    session._confirm_layouts(slow, deadline=100.0)  # type: ignore[arg-type]
    in_tp2 = in_layout(baseline_candidate(), "tp2")
    assert slow.judged == [in_tp2.id] and session.winner_id() == in_tp2.id
    summary = write_report(session, 1.0, False)
    assert summary["winner_id"] == in_tp2.id
    winner = load_candidate_dir(tmp_path / "run" / "winner")
    assert declared_layout(winner.source) == {"tp": 2} and winner.id == in_tp2.id
    # The reserve holds a confirmation per layout beside the best candidate's.
    assert session.confirmations == 2


def test_a_best_forward_that_cannot_run_in_the_layout_gives_way_to_the_reference(tmp_path: Path) -> None:
    clock = Clock()
    session = _session(tmp_path, clock)
    best = Candidate.from_source(baseline_candidate().source + ONE_DEVICE_ONLY, author="test", description="best")
    session.sources[best.id] = best
    session.slow_verdicts[best.id] = Verdict(best.id, session.baseline.id, accepted=True, stage="accepted",
                                             reason="", status="accepted", gpu_s_per_1k_requests=0.8)
    slow = StandInEvaluator(verdict=_judge, clock=clock, cost_s=5.0)
    session._confirm_layouts(slow, deadline=100.0)  # type: ignore[arg-type]
    assert slow.judged == [in_layout(best, "tp2").id, in_layout(baseline_candidate(), "tp2").id]
    assert session.winner_id() == in_layout(baseline_candidate(), "tp2").id  # 0.5 device-seconds against 0.8


def test_no_layout_is_confirmed_once_the_budget_is_spent(tmp_path: Path) -> None:
    clock = Clock()
    session = _session(tmp_path, clock)
    clock.now = 100.0
    slow = StandInEvaluator(verdict=_judge, clock=clock, cost_s=5.0)
    session._confirm_layouts(slow, deadline=100.0)  # type: ignore[arg-type]
    assert slow.judged == [] and session.winner_id() is None


def _plan(tmp_path: Path, model: str = "tiny-dense") -> Path:
    rows = [{"layout": "dp2", "fits": True}, {"layout": "tp2", "fits": True}, {"layout": "tp2.ep2", "fits": False},
            {"layout": "tp1", "fits": True}, {"layout": "dcp2", "fits": True}]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"model": model, "levels": {"1": [{"layout": "tp4", "fits": True}], "8": rows,
                                                          "64": [{"layout": "tp4", "fits": True}]}}))
    return path


def test_a_plan_gives_its_cheapest_fitting_layouts_one_engine_runs_at_the_nearest_level(tmp_path: Path) -> None:
    # Concurrency 16 is nearest level 8; dp2 is replicas (not one engine), tp2.ep2 does not fit, tp1 is one device.
    assert plan_layouts(_plan(tmp_path), "tiny-dense", 16, top=2) == ("tp2", "dcp2")
    assert plan_layouts(_plan(tmp_path), "tiny-dense", 16, top=1) == ("tp2",)
    assert plan_layouts(_plan(tmp_path), "tiny-dense", 64, top=2) == ("tp4",)
    with pytest.raises(ConfigError, match="plans 'tiny-moe', not this compile's tiny-dense"):
        plan_layouts(_plan(tmp_path, "tiny-moe"), "tiny-dense", 8, top=2)


@pytest.mark.parametrize(("flags", "error"), [
    (["--plan", "missing.json"], "--plan missing.json: cannot read it"),
    (["--layout", "tp3"], "does not divide over 3 ranks"),
    (["--layout", "tpx"], "--layout tpx: give degrees"),
])
def test_bad_layout_flags_are_one_line_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str], flags: list[str], error: str) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["compile", "--model", "tiny-dense", "--device", "cpu", "--out", str(tmp_path / "run"), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and error in err[0] and not (tmp_path / "run").exists(), err
