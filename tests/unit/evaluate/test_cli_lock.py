"""`athanor evaluate`: exit status, JSON record, one-line errors; the device lock excludes others."""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path

import eval_candidates as c
import pytest

from athanor.cli import main
from athanor.evaluate.lock import device_lock, lock_paths


def test_cli_rejects_wrong_candidate_with_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "wrong.py"
    src.write_text(c.WRONG.source)
    out = tmp_path / "verdict.json"
    code = main(["evaluate", str(src), "--model", "tiny-dense", "--max-seqs", "2", "--max-seq-len", "64",
                 "--pairs", "8", "--json", str(out)])
    assert code == 1
    record = json.loads(out.read_text())
    assert record["accepted"] is False and record["stage"] == "correctness"
    assert set(record["speedup"]) >= {"median", "ci_low", "ci_high"}
    assert "gpu_s_per_1k_requests" in record and record["versions"]["torch"]
    assert "REJECTED at correctness" in capsys.readouterr().out


def test_cli_user_mistakes_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", str(tmp_path / "missing.py"), "--model", "tiny-dense"]) == 2
    assert "no such candidate file" in capsys.readouterr().err
    src = tmp_path / "c.py"
    src.write_text(c.HONEST.source)
    assert main(["evaluate", str(src), "--model", "tiny-dense", "--quality-budget", "kld=1"]) == 2
    assert "--quality-budget" in capsys.readouterr().err
    assert main(["evaluate", str(src), "--model", "tiny-dense", "--bitwise", "--quality-budget", "kl=0.01"]) == 2
    assert "--bitwise and --quality-budget" in capsys.readouterr().err


def _hold(path_env: str, seconds: float) -> None:
    import os

    os.environ["ATHANOR_CACHE"] = path_env
    with device_lock("cpu"):
        time.sleep(seconds)


def test_device_lock_excludes_other_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATHANOR_CACHE", str(tmp_path))
    assert lock_paths("cuda") == lock_paths("cuda:0") != lock_paths("cpu")
    first = lock_paths("cpu")[0]  # every holder of the CPU takes it first
    # Forked holders: another process, which needs only the lock, not a fresh interpreter importing torch.
    holder = multiprocessing.get_context("fork").Process(target=_hold, args=(str(tmp_path), 1.0))
    holder.start()
    while not first.exists() or not first.read_text().strip():
        time.sleep(0.02)
    with device_lock("cpu") as waited:
        assert waited > 0.3  # the other process held it
    holder.join()
    with pytest.raises(TimeoutError):
        holder = multiprocessing.get_context("fork").Process(target=_hold, args=(str(tmp_path), 1.0))
        holder.start()
        while not first.read_text().strip():
            time.sleep(0.02)
        try:
            with device_lock("cpu", timeout_s=0.1):
                pass
        finally:
            holder.join()


def _hold_on_core(path_env: str, core: int, seconds: float) -> None:
    import os

    os.environ["ATHANOR_CACHE"] = path_env
    os.sched_setaffinity(0, {core})
    with device_lock("cpu"):
        time.sleep(seconds)


def test_processes_pinned_to_other_cores_time_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores to pin two processes apart")
    monkeypatch.setenv("ATHANOR_CACHE", str(tmp_path))
    holder = multiprocessing.get_context("fork").Process(target=_hold_on_core, args=(str(tmp_path), cores[0], 1.0))
    holder.start()
    first = tmp_path / "locks" / f"cpu{cores[0]}.lock"
    while not first.exists() or not first.read_text().strip():
        time.sleep(0.02)
    try:
        os.sched_setaffinity(0, {cores[1]})
        with device_lock("cpu") as waited:  # another core: free at once
            assert waited < 0.3
    finally:
        os.sched_setaffinity(0, set(cores))
    with device_lock("cpu") as waited:  # every core: waits for the holder of the first
        assert waited > 0.3
    holder.join()
