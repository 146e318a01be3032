"""The compile loop end to end on a tiny preset: report, store, resume, bad configuration."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from loop_doubles import StandInEvaluator, slower

from athanor.cli import main
from athanor.engine.candidate import Candidate, baseline_candidate
from athanor.errors import ConfigError
from athanor.evaluate import EvaluateConfig, Evaluator, QualityBudget
from athanor.loop import CompileConfig, compile_session
from athanor.loop.reserve import measured_reserve
from athanor.store import open_store


def _config(out: Path, **kw) -> CompileConfig:
    # A stated reserve: what the tests check does not depend on this machine's record of past confirmations.
    base = dict(model="tiny-dense", traffic="preset:chat", budget_s=40.0, out_dir=out, max_seqs=8, max_seq_len=256,
                confirm_reserve_s=10.0)
    return CompileConfig(**{**base, **kw})


@pytest.mark.timing  # its verdict rests on measured speed: run alone (Makefile `test`)
def test_the_whole_loop_on_a_tiny_preset(tmp_path: Path, cost_records: Path, plant: Callable[..., Any],
                                         write_slow_candidate: Callable[[Path], Candidate]) -> None:
    """Compile to a verified winner on the CPU, its outcome certain: one planted honest candidate (the reference
    forward under another id) against an incumbent twice as slow (the reference running every step twice). The
    budget's clock stands still, so the run's length is its candidates: the incumbent's contender (the reference)
    and the planted one. The variant search over a wall-clock budget is the slow tier's
    (tests/slow/test_compile_slow.py)."""
    slow = write_slow_candidate(tmp_path / "incumbent")
    honest = Candidate.from_source(baseline_candidate().source + "\n# the reference forward under another id\n",
                                   description="the reference forward, planted")
    agent = plant(honest)
    events: list[str] = []
    config = _config(tmp_path / "run", agents=("planted",), incumbent=tmp_path / "incumbent",
                     dashboard="http://127.0.0.1:8300/")
    report = compile_session(config, on_event=events.append, clock=lambda: 0.0, max_candidates=1)
    log = "\n".join(events)
    assert f"{config.reserve_s():.0f} s to confirm; ends about" in events[0], log  # the stated reserve
    fast = [line for line in events if line.startswith("[fast]")]
    reference = baseline_candidate().id
    assert [line.split()[1] for line in fast] == [reference, honest.id], log  # the reference is the first contender
    assert report.verified and report.winner_id in (reference, honest.id), log
    assert [ev.candidate_id for ev in agent.observed if ev.tier == "fast"][-1] == honest.id  # the agent was told

    data = json.loads((tmp_path / "run" / "report.json").read_text())
    assert data["run_id"] == report.run_id and data["verified"] is True and data["winner_id"] == report.winner_id
    assert data["candidates_evaluated"]["per_agent"] == {"reference": 1, "planted": 1}
    assert data["incumbent"]["id"] == slow.id and data["incumbent"]["dir"] == str(tmp_path / "incumbent")
    assert data["speedup"]["against"] == "incumbent" and data["speedup"]["incumbent_id"] == slow.id
    assert data["speedup"]["ci_low"] > 1.0
    md = (tmp_path / "run" / "report.md").read_text()
    assert md.startswith("# athanor compile: tiny-dense") and f"incumbent `{slow.id}`" in md
    page = f"http://127.0.0.1:8300/runs/{report.run_id}"  # the run's pages on the dashboard, linked
    assert f"<{page}>" in md and f"[`{report.winner_id}`]({page}/candidates/{report.winner_id})" in md
    with open_store(tmp_path / "run") as store:
        run = store.get_run(report.run_id)
        assert run is not None and run.status == "finished"
        evaluations = store.evaluations(report.run_id)
        assert len(evaluations) == sum(data["candidates_evaluated"]["per_tier"].values())
        assert all(ev.stage for ev in evaluations)
        # The screen's cheaper projection is confirmed first, and accepted: the run's one confirmation.
        screened = {ev.candidate_id: ev for ev in evaluations if ev.tier == "fast"}
        assert set(screened) == {reference, honest.id}
        confirmed = [ev for ev in evaluations if ev.tier == "slow"]
        assert [ev.candidate_id for ev in confirmed] == [report.winner_id] and confirmed[0].accepted
        assert report.winner_id == min(screened.values(), key=lambda ev: ev.figures["gpu_s_per_1k_requests"]
                                       ).candidate_id
        # A first confirmation timed to the end is recorded: the next run's reserve is what it cost.
        assert "slow" in dict(confirmed[0].figures["stages"])
    assert measured_reserve(config.confirmation_key) is not None
    winner = tmp_path / "run" / "winner"
    assert (winner / "candidate.py").is_file() and (winner / "manifest.json").is_file()
    verification = json.loads((winner / "verification.json").read_text())
    assert verification["slow"]["accepted"] is True and verification["slow"]["incumbent_id"] == slow.id
    # A resume must time against the same incumbent (checked before anything is written).
    with pytest.raises(ConfigError, match=f"--incumbent: run {report.run_id} .* incumbent {slow.id}"):
        compile_session(dataclasses.replace(config, incumbent=None, resume=True))


def test_interrupt_keeps_results_and_resume_continues(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C keeps what was screened, and --resume goes on with the same run, screening only what is new. The
    evaluator is a stand-in that judges at once (every candidate timed slower: nothing to confirm), the resumed
    run bounded by a candidate count; the same over real evaluations and a wall-clock budget is the slow tier's
    (tests/slow/test_compile_slow.py)."""
    import athanor.loop.session

    monkeypatch.setattr(athanor.loop.session, "Evaluator", lambda config: StandInEvaluator(config, verdict=slower))
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
    assert json.loads((out / "report.json").read_text())["interrupted"] is True
    with pytest.raises(ConfigError, match="--resume"):
        compile_session(_config(out))
    events: list[str] = []
    second = compile_session(_config(out, resume=True), on_event=events.append, max_candidates=3)
    assert second.run_id == first.run_id and not second.interrupted
    assert events[0] == f"resuming run {first.run_id} (1 evaluations so far)", events
    assert "no candidate passed the fast tier's screen: nothing to confirm" in events
    with open_store(out) as store:
        assert store.get_run(first.run_id).status == "finished"  # type: ignore[union-attr]
        evaluations = store.evaluations(first.run_id)
    fast_ids = [ev.candidate_id for ev in evaluations if ev.tier == "fast"]
    assert len(fast_ids) == 4 and len(set(fast_ids)) == 4 and set(fast_ids) > done  # three more, none twice


def test_bad_configuration(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--agents: unknown agent 'nope'"):
        compile_session(_config(tmp_path / "a", agents=("variant", "nope")))
    env = "ATHANOR_TEST_NO_SUCH_KEY"
    os.environ.pop(env, None)
    from athanor.agents.config import AgentsConfig, LLMConfig

    with pytest.raises(ConfigError, match=env):
        compile_session(_config(tmp_path / "b", agents=("llm",),
                                agents_config=AgentsConfig(llm=LLMConfig(api_key_env=env))))
    with pytest.raises(ConfigError, match="--resume"):
        compile_session(_config(tmp_path / "c", resume=True))


def test_an_unreachable_endpoint_stops_that_agent_not_the_run(tmp_path: Path) -> None:
    from athanor.agents.config import AgentsConfig, LLMConfig

    events: list[str] = []
    config = _config(tmp_path / "run", agents=("llm",), budget_s=15.0, agents_config=AgentsConfig(
        llm=LLMConfig(base_url="http://127.0.0.1:9/v1", api_key_env="", max_retries=0, timeout_s=5)))
    report = compile_session(config, on_event=events.append)
    assert any(line.startswith("llm:") and "agent stopped" in line for line in events), events
    # The run itself ends normally, with its report and the warning on the board.
    assert not report.interrupted and (tmp_path / "run" / "report.json").is_file()
    with open_store(tmp_path / "run") as store:
        assert store.get_run(report.run_id).status == "finished"  # type: ignore[union-attr]
        assert any(p.kind == "warning" and p.agent == "llm" for p in store.posts(report.run_id))


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    compile_args = ["compile", "--model", "tiny-dense", "--out", str(out)]
    # The first through a process of its own (the entry point, its exit status), the others through `main`.
    done = subprocess.run([sys.executable, "-m", "athanor", *compile_args, "--agents", "nope"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "--agents" in done.stderr
    for args, needle in ((["--budget", "soon"], "--budget soon"), (["--incumbent", str(tmp_path / "nope")],
                                                                      "--incumbent")):
        assert main([*compile_args, *args]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and needle in err, err
    assert not out.exists()  # a bad configuration writes nothing


def test_cli_quality_budget_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    for args, needles in ((["--bitwise", "--quality-budget", "kl=0.01,ppl=0.02"], ["--bitwise", "--quality-budget"]),
                          (["--quality-budget", "kl=lots"], ["--quality-budget kl=lots"]),
                          (["--quality-budget", "kl=0.01,top1=0.9"], ["unknown key 'top1'"]),
                          (["--quality-budget", "ppl=-0.5"], ["ppl must be"])):
        assert main(["compile", "--model", "tiny-dense", "--out", str(out), *args]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and all(n in err for n in needles), err
    assert not out.exists()


def test_quality_mode_is_recorded_and_kept_on_resume(tmp_path: Path) -> None:
    out = tmp_path / "run"
    budget = QualityBudget(max_kl=0.01, max_ppl_increase=0.02)
    config = _config(out, quality=budget)
    assert config.evaluate_config("fast").quality == config.evaluate_config("slow").quality == budget

    def interrupt_at_start(line: str) -> None:
        if line.startswith("run "):  # the first event: the run is stored, nothing evaluated yet
            assert "quality mode (--quality-budget kl=0.01,ppl=0.02)" in line
            raise KeyboardInterrupt

    assert compile_session(config, on_event=interrupt_at_start).interrupted
    report = json.loads((out / "report.json").read_text())
    assert report["precision"] == {"mode": "quality", "quality_budget": {"max_kl": 0.01, "max_ppl_increase": 0.02}}
    assert "**Quality mode**" in (out / "report.md").read_text()
    with pytest.raises(ConfigError, match="--quality-budget kl=0.01,ppl=0.02"):  # a resume may not change the mode
        compile_session(_config(out, resume=True))
    with pytest.raises(ConfigError, match="--quality-budget kl=0.01,ppl=0.02"):
        compile_session(_config(out, resume=True, quality=QualityBudget(max_kl=0.1)))
    assert compile_session(_config(out, resume=True, quality=budget), on_event=interrupt_at_start).interrupted


def test_gpu_fast_tier_is_a_cheaper_screen_and_the_slow_tier_keeps_the_defaults() -> None:
    # max_seqs given: no CUDA device is needed to size the engines
    config = CompileConfig(model="tiny-dense", device="cuda", max_seqs=8, max_seq_len=512)
    fast, slow = config.evaluate_config("fast"), config.evaluate_config("slow")
    defaults = EvaluateConfig(model="tiny-dense")
    assert (slow.decode_pairs, slow.prefill_pairs, slow.max_decode_shapes, slow.max_budget_factor, slow.check_tokens) \
        == (defaults.decode_pairs, defaults.prefill_pairs, defaults.max_decode_shapes, defaults.max_budget_factor,
            defaults.check_tokens)
    assert fast.decode_pairs < slow.decode_pairs and fast.prefill_pairs == slow.prefill_pairs
    assert fast.max_decode_shapes == 1 and fast.check_tokens > 0
    assert (fast.max_seqs, fast.max_seq_len) == (slow.max_seqs, slow.max_seq_len) == (8, 512)
    assert slow.timing_budget_s == defaults.timing_budget_s > 0 and slow.precision == defaults.precision

    # The screen times one round of pairs per shape, however noisy its A/A interval; the slow tier adds
    # rounds while its time budget and the interval call for them.
    rng = np.random.default_rng(0)
    noisy = [rng.normal(1e-3, 2e-4, size=(3, fast.prefill_pairs))]  # an A/A interval far wider than ±1%
    assert Evaluator(fast)._more_pairs(noisy, fast.prefill_pairs) == 0
    assert Evaluator(slow)._more_pairs(noisy, slow.prefill_pairs) > 0
