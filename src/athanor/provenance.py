"""Where a figure came from: device, versions and git commit, for every benchmark and verdict record."""

from __future__ import annotations

import datetime
import functools
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from athanor import settings


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, cwd=Path(__file__).parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@functools.cache
def git_commit() -> str:
    """`settings.commit()` where set, else `git rev-parse HEAD`, with "-dirty" when tracked files differ from it:
    a tree copied beside an older .git then says so instead of naming a commit that did not run."""
    # Cached: the code a process runs is the code it imported, and every verdict asks.
    if override := settings.commit():
        return override
    head = _git("rev-parse", "HEAD")
    if not head:
        return "unknown"
    changed = _git("status", "--porcelain", "--untracked-files=no")
    return head + ("-dirty" if changed else "")


def triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return str(triton.__version__)


def environment(device: str | torch.device | None = None) -> dict[str, Any]:
    """Device name, GPU, versions, threads, commit and time."""
    device = str(device) if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "device": device,
        "device_name": gpu if device.startswith("cuda") else (platform.processor() or platform.machine()),
        "gpu": gpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version(),
        "host": platform.node(),
    }
