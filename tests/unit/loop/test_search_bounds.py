"""What ends a compile session's search and confirmations: a candidate count, the budget's clock, agents with
nothing to propose. The evaluator is a stand-in that judges at once (the bounds are under test, not the judging)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from loop_doubles import Clock, StandInEvaluator, refused

from athanor.engine.candidate import Candidate, baseline_candidate
from athanor.evaluate import Verdict
from athanor.loop import CompileConfig
from athanor.loop.session import Session


def _session(tmp_path: Path, clock: Clock, **kw: Any) -> Session:
    config = CompileConfig(model="tiny-dense", traffic="preset:chat", budget_s=100.0, out_dir=tmp_path / "run",
                           max_seqs=8, max_seq_len=256, agents=kw.pop("agents", ("variant",)))
    return Session(config, lambda line: None, clock=clock, **kw)


def test_max_candidates_stops_the_search_whatever_the_budget(tmp_path: Path) -> None:
    clock = Clock()
    session = _session(tmp_path, clock, max_candidates=3)
    fast = StandInEvaluator(verdict=refused, clock=clock, cost_s=0.0)
    session._search(fast, deadline=float("inf"), guess=False)  # type: ignore[arg-type]
    assert len(fast.judged) == 3 == len(set(fast.judged)) == session.screened
    assert len(session.store.evaluations(session.run_id)) == 3  # each recorded as it was judged


def test_the_budget_clock_stops_the_search(tmp_path: Path) -> None:
    clock = Clock()
    session = _session(tmp_path, clock)
    fast = StandInEvaluator(verdict=refused, clock=clock, cost_s=10.0)
    session._search(fast, deadline=25.0, guess=False)  # type: ignore[arg-type]
    assert len(fast.judged) == 3 and clock.now == 30.0  # judged at 0, 10 and 20 s; at 30 s the share is spent


def test_an_agent_with_nothing_new_ends_the_search(tmp_path: Path, plant: Callable[..., Any]) -> None:
    base = baseline_candidate().source
    plant(*(Candidate.from_source(base + f"\n# planted {i}\n") for i in range(2)))
    clock = Clock()
    session = _session(tmp_path, clock, agents=("planted",))
    fast = StandInEvaluator(verdict=refused, clock=clock, cost_s=1.0)
    session._search(fast, deadline=float("inf"), guess=False)  # type: ignore[arg-type]
    assert len(fast.judged) == 2


def test_the_first_confirmation_runs_past_the_deadline_and_no_other(tmp_path: Path) -> None:
    clock = Clock()
    session = _session(tmp_path, clock)
    incumbent = baseline_candidate()
    costs = itertools.count(1.0)
    for i in range(3):
        cand = Candidate.from_source(incumbent.source + f"\n# screened {i}\n")
        session.sources[cand.id] = cand
        session.fast_verdicts[cand.id] = Verdict(cand.id, incumbent.id, accepted=True, stage="accepted", reason="",
                                                 status="accepted", gpu_s_per_1k_requests=next(costs))
    cheapest = min(session.fast_verdicts.values(), key=lambda v: v.gpu_s_per_1k_requests).candidate_id

    def slow_refused(candidate: Candidate, incumbent: Candidate) -> Verdict:
        return Verdict(candidate.id, incumbent.id, accepted=False, stage="slow", reason="stand-in", wall_s=1.0)

    clock.now = 50.0
    slow = StandInEvaluator(verdict=slow_refused, clock=clock, cost_s=5.0)
    session._confirm(slow, deadline=40.0, margin=0.01)  # type: ignore[arg-type]
    assert slow.judged == [cheapest]  # the best screened first, though the budget was spent; then none
    slow = StandInEvaluator(verdict=slow_refused, clock=clock, cost_s=5.0)
    session.slow_verdicts.clear()
    clock.now = 0.0
    session._confirm(slow, deadline=10.0, margin=0.01)  # type: ignore[arg-type]
    assert len(slow.judged) == 2  # another starts only where the last one's cost still fits: 0-5 s, 5-10 s; not a third


def test_with_no_record_the_first_screen_scaled_to_the_whole_model_is_kept_to_confirm(tmp_path: Path) -> None:
    clock = Clock()
    session = _session(tmp_path, clock)
    fast = StandInEvaluator(verdict=refused, clock=clock, cost_s=10.0)
    session._search(fast, deadline=100.0, guess=True)  # type: ignore[arg-type]
    # tiny-dense: 4 layers, the fast tier's 2, so the first 10-s screen says confirming takes 20 s: the search
    # stops at 80 s (screens at 0, 10, ..., 70).
    assert session.reserve == 20.0 and len(fast.judged) == 8 and clock.now == 80.0


def test_max_candidates_below_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_candidates"):
        _session(tmp_path, Clock(), max_candidates=0)
