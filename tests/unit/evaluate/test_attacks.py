"""Issue 37's open classes of cheating, one or more candidates each (`attacks.py`), on tiny-dense (CPU).

Static checks are off throughout (the issue: they are not a defence), so each outcome rests on the run-time
design. Classes 1-4 share the session's evaluator with static checks off: a cheat that reached beyond its own
worker (the incumbent, the reference) would show in the tests after it too. Class 5 has an evaluator of its own,
whose close is part of what it checks. Each test prints what the cheat achieved, so a run shows whether it wins.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import attacks as a
import eval_candidates as c
import pytest
from eval_config import CONFIG

from athanor.engine.config import EngineConfig
from athanor.evaluate import Evaluator, Verdict

ATTACK_CONFIG = dataclasses.replace(CONFIG, static_checks=False)


def _show(v: Verdict) -> str:
    return (f"accepted={v.accepted} status={v.status} stage={v.stage}: {v.reason} "
            f"speedup={v.speedup.median:.3f} [{v.speedup.ci_low:.3f}, {v.speedup.ci_high:.3f}] "
            f"({v.speedup.num_pairs} pairs; stages: {', '.join(f'{k} {s:.1f} s' for k, s in v.stages)})")




# -- 1. slowing the incumbent ------------------------------------------------------------------------
@pytest.mark.timing  # its verdict rests on measured speed: run alone (Makefile `test`)
def test_slowing_the_incumbent_and_its_twin_does_not_win(runtime_evaluator: Evaluator) -> None:
    v = runtime_evaluator.evaluate(a.SLOW_OTHERS, incumbent=c.BASE)
    print("slowing the incumbent:", _show(v))
    assert v.accepted is False, _show(v)


# -- 2. a transient clock -------------------------------------------------------------------------------
@pytest.mark.timing  # its verdict rests on measured speed: run alone (Makefile `test`)
def test_a_clock_replaced_only_inside_its_own_windows_does_not_win(runtime_evaluator: Evaluator) -> None:
    v = runtime_evaluator.evaluate(a.TRANSIENT_CLOCK, incumbent=c.BASE)
    print("transient clock:", _show(v))
    assert v.accepted is False, _show(v)


# -- 3. work outside the timed window ---------------------------------------------------------------
@pytest.mark.timing  # its verdict rests on measured speed: run alone (Makefile `test`)
def test_computing_ahead_on_a_background_thread_does_not_win(runtime_evaluator: Evaluator) -> None:
    v = runtime_evaluator.evaluate(a.COMPUTE_AHEAD, incumbent=c.BASE)
    print("computing ahead:", _show(v))
    assert v.accepted is False, _show(v)


# -- 4. poisoning the trusted reference ---------------------------------------------------------------
def test_a_wrong_candidate_cannot_make_the_reference_agree(runtime_evaluator: Evaluator) -> None:
    # Against a slowed incumbent the wrong candidate is faster, so a rejection at timing would mean its
    # wrong outputs passed every check: it must be refused before timing, as a candidate (not as an evaluator
    # error), for its outputs or for the attempt.
    v = runtime_evaluator.evaluate(a.POISON_REFERENCE, incumbent=c.SLOWED)
    print("poisoning the reference:", _show(v))
    assert v.accepted is False, _show(v)
    assert v.status == "rejected" and v.stage not in ("timing", "slow"), _show(v)


# -- 5. side effects that outlive the evaluation ------------------------------------------------------
def _shared_compile_cache() -> Path:
    """The compile cache every engine shares by default (the serving engine's too)."""
    return EngineConfig(model=CONFIG.model).compile_cache_dir()


def _processes_with(mark: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if mark.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _traces(mark: str) -> dict[str, list[str]]:
    cache = _shared_compile_cache()
    return {
        "/dev/shm": [str(p) for p in Path("/dev/shm").glob(f"*{mark}*")],
        "compile cache": [str(p) for p in cache.glob(f"*/{mark}")] if cache.is_dir() else [],
        "processes": [str(pid) for pid in _processes_with(mark)],
    }


@pytest.fixture(scope="module")
def side_effects() -> Iterator[dict[str, dict[str, list[str]]]]:
    """What `attacks.side_effects` left after an evaluation and after its evaluator closed; cleaned up after."""
    mark = f"athanor-attack-{uuid.uuid4().hex[:12]}"
    seen: dict[str, dict[str, list[str]]] = {}
    try:
        with Evaluator(ATTACK_CONFIG) as ev:
            v = ev.evaluate(a.side_effects(mark), incumbent=c.BASE)
            print("side effects:", _show(v))
            seen["evaluated"] = _traces(mark)
        seen["closed"] = _traces(mark)
        print("side effects left:", seen)
        yield seen
    finally:
        for pid in _processes_with(mark):  # the candidate's processes, found by its mark
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for path in Path("/dev/shm").glob(f"*{mark}*"):
            path.unlink(missing_ok=True)
        if _shared_compile_cache().is_dir():
            for path in _shared_compile_cache().glob(f"*/{mark}"):
                shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("when", ["evaluated", "closed"])
def test_no_file_left_in_dev_shm(side_effects: dict[str, dict[str, list[str]]], when: str) -> None:
    assert side_effects[when]["/dev/shm"] == [], side_effects[when]


@pytest.mark.parametrize("when", ["evaluated", "closed"])
def test_nothing_planted_in_the_shared_compile_cache(side_effects: dict[str, dict[str, list[str]]],
                                                     when: str) -> None:
    assert side_effects[when]["compile cache"] == [], side_effects[when]


@pytest.mark.parametrize("when", ["evaluated", "closed"])
def test_no_process_outlives_the_evaluation(side_effects: dict[str, dict[str, list[str]]], when: str) -> None:
    assert side_effects[when]["processes"] == [], side_effects[when]
