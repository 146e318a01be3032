"""A compile session given an incumbent: candidates are timed against it, the reference competes, the report says so."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from athanor.engine.candidate import Candidate, baseline_candidate
from athanor.errors import ConfigError
from athanor.loop import CompileConfig, compile_session


@pytest.mark.timing  # its verdict rests on measured speed: run alone (Makefile `test`)
def test_a_slow_incumbent_is_beaten_and_named(tmp_path: Path, write_slow_candidate: Callable[[Path], Candidate]) -> None:
    slow = write_slow_candidate(tmp_path / "incumbent")
    out = tmp_path / "run"
    events: list[str] = []
    config = CompileConfig(model="tiny-dense", traffic="preset:chat", budget_s=40.0, out_dir=out, max_seqs=8,
                           max_seq_len=256, incumbent=tmp_path / "incumbent")
    report = compile_session(config, on_event=events.append)
    fast = [line for line in events if line.startswith("[fast]")]
    reference = baseline_candidate().id
    assert fast and fast[0].startswith(f"[fast] {reference} "), events  # the reference is the first contender
    assert report.verified and report.winner_id, "\n".join(events)
    data = json.loads((out / "report.json").read_text())
    assert data["incumbent"]["id"] == slow.id and data["incumbent"]["dir"] == str(tmp_path / "incumbent")
    assert data["speedup"]["against"] == "incumbent" and data["speedup"]["incumbent_id"] == slow.id
    assert data["speedup"]["ci_low"] > 1.0
    verification = json.loads((out / "winner" / "verification.json").read_text())
    assert verification["slow"]["incumbent_id"] == slow.id and verification["slow"]["accepted"] is True
    assert f"incumbent `{slow.id}`" in (out / "report.md").read_text()
    # A resume must time against the same incumbent (checked before anything is written).
    with pytest.raises(ConfigError, match=f"--incumbent: run {report.run_id} .* incumbent {slow.id}"):
        compile_session(CompileConfig(**{**config.__dict__, "incumbent": None, "resume": True}))


def test_a_bad_incumbent_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for directory in (tmp_path / "missing", tmp_path / "empty"):
        with pytest.raises(ConfigError, match="^--incumbent: "):
            compile_session(CompileConfig(model="tiny-dense", out_dir=tmp_path / "run", incumbent=directory))
    assert not (tmp_path / "run").exists()
