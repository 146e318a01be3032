"""The compile loop over a real wall-clock budget, with the variant search proposing: the runs the default tier
bounds by candidates instead (tests/unit/loop/test_compile.py). Each takes a minute or more on a 2-core CPU."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from athanor.engine.candidate import Candidate, baseline_candidate
from athanor.errors import ConfigError
from athanor.loop import CompileConfig, compile_session
from athanor.store import open_store

pytestmark = [pytest.mark.slow, pytest.mark.timing]  # verdicts on measured speed: run alone (`make test-slow`)


def _config(out: Path, **kw) -> CompileConfig:
    # A stated reserve: what the tests check does not depend on this machine's record of past confirmations.
    base = dict(model="tiny-dense", traffic="preset:chat", budget_s=40.0, out_dir=out, max_seqs=8, max_seq_len=256,
                confirm_reserve_s=10.0)
    return CompileConfig(**{**base, **kw})


def test_a_slow_incumbent_is_beaten_and_named(tmp_path: Path, write_slow_candidate: Callable[[Path], Candidate]) -> None:
    """The variant search screens for the budget's search share, then the best screened is confirmed: against an
    incumbent twice as slow, a winner is certain (the reference itself is one)."""
    slow = write_slow_candidate(tmp_path / "incumbent")
    out = tmp_path / "run"
    events: list[str] = []
    config = _config(out, incumbent=tmp_path / "incumbent")
    report = compile_session(config, on_event=events.append)
    fast = [line for line in events if line.startswith("[fast]")]
    reference = baseline_candidate().id
    assert fast and fast[0].startswith(f"[fast] {reference} "), events  # the reference is the first contender
    assert report.verified and report.winner_id, "\n".join(events)
    data = json.loads((out / "report.json").read_text())
    assert data["candidates_evaluated"]["per_agent"].get("variant", 0) >= 1, events  # the search proposed
    assert data["incumbent"]["id"] == slow.id and data["incumbent"]["dir"] == str(tmp_path / "incumbent")
    assert data["speedup"]["against"] == "incumbent" and data["speedup"]["incumbent_id"] == slow.id
    assert data["speedup"]["ci_low"] > 1.0
    verification = json.loads((out / "winner" / "verification.json").read_text())
    assert verification["slow"]["incumbent_id"] == slow.id and verification["slow"]["accepted"] is True
    assert f"incumbent `{slow.id}`" in (out / "report.md").read_text()
    # A resume must time against the same incumbent (checked before anything is written).
    with pytest.raises(ConfigError, match=f"--incumbent: run {report.run_id} .* incumbent {slow.id}"):
        compile_session(CompileConfig(**{**config.__dict__, "incumbent": None, "resume": True}))


def test_interrupt_keeps_results_and_resume_continues(tmp_path: Path) -> None:
    """A resumed run goes on to the end of its own budget, screening only what is new."""
    out = tmp_path / "run"

    def interrupt_after_first(line: str) -> None:
        if line.startswith("[fast]"):
            raise KeyboardInterrupt

    first = compile_session(_config(out), on_event=interrupt_after_first)
    assert first.interrupted
    with open_store(out) as store:
        assert store.get_run(first.run_id).status == "interrupted"  # type: ignore[union-attr]
        done = {ev.candidate_id for ev in store.evaluations(first.run_id)}
    assert len(done) == 1
    with pytest.raises(ConfigError, match="--resume"):
        compile_session(_config(out))
    second = compile_session(_config(out, resume=True, budget_s=15.0), on_event=lambda _: None)
    assert second.run_id == first.run_id and not second.interrupted
    with open_store(out) as store:
        assert store.get_run(first.run_id).status == "finished"  # type: ignore[union-attr]
        evaluations = store.evaluations(first.run_id)
    fast_ids = [ev.candidate_id for ev in evaluations if ev.tier == "fast"]
    assert len(fast_ids) > 1 and len(set(fast_ids)) == len(fast_ids)  # nothing evaluated twice
