"""The device lock: measurements on one device never overlap, and timing on CPU pins threads.

A timing taken while another engine, agent or compile uses the same device is noise, so every
athanor process that times or compiles on a device holds that device's lock: an `fcntl.flock`
on a file in the cache directory (`athanor.settings.cache_dir()/locks/<device>.lock`). On the CPU
the device is the cores the process may run on: one lock per core of its affinity, taken in
order, so processes pinned to different cores (a cluster's screeners) time at once while one
that may use every core waits for all of them. The kernel releases
it when the holder dies, so a crashed evaluator never wedges the others. Other athanor
processes wait on the same lock (`device_lock(device)`); the lock is advisory, and non-athanor
processes are not held.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

from athanor.settings import cache_dir

log = logging.getLogger(__name__)


def lock_dir() -> Path:
    """The locks' directory: one for every athanor process that shares the cache directory."""
    return cache_dir() / "locks"


def lock_paths(device: str) -> list[Path]:
    """The locks of a physical device: "cuda" and "cuda:0" are the same device; on the CPU, one per core this
    process may run on."""
    name = device.strip().lower()
    if name.startswith("cpu"):
        return [lock_dir() / f"cpu{core}.lock" for core in sorted(os.sched_getaffinity(0))]
    if name == "cuda":
        name = "cuda:0"
    return [lock_dir() / (re.sub(r"[^a-z0-9_.-]", "_", name) + ".lock")]


@contextlib.contextmanager
def device_lock(device: str, timeout_s: float = 3600.0) -> Iterator[float]:
    """Hold `device` exclusively (every lock of it, in order); yields the seconds waited. TimeoutError after
    `timeout_s`."""
    t0 = time.monotonic()
    with contextlib.ExitStack() as held:
        for path in lock_paths(device):
            held.enter_context(_flock(path, t0, timeout_s))
        yield time.monotonic() - t0


@contextlib.contextmanager
def _flock(path: Path, t0: float, timeout_s: float) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        logged = False
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not logged:
                    log.info("waiting for %s (held by another athanor process)", path)
                    logged = True
                if time.monotonic() - t0 > timeout_s:
                    raise TimeoutError(f"{path}: held by another process for more than {timeout_s:.0f}s") from None
                time.sleep(0.05)
        try:
            f.seek(0)
            f.truncate()
            f.write(f"{os.getpid()}\n")
            f.flush()
            yield
        finally:
            f.seek(0)
            f.truncate()  # empty while free: the file names the holder only while it holds the lock
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def timing_threads(device: str) -> int:
    """Intra-op threads for an engine that is timed on `device`.

    On CPU, one less than the usable cores, at least one: the caller's process and the OS keep a
    core, and OpenMP threads competing for cores spin and turn timings into noise. On CUDA, one: the
    host thread launches graphs and waits, and the little CPU work of a step (fingerprints, copies)
    spread over torch's default pool of every core would be CPU time no turn accounts for.
    """
    if not device.startswith("cpu"):
        return 1
    return max(1, len(os.sched_getaffinity(0)) - 1)
