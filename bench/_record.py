"""What every benchmark JSON carries: machine, versions, commit, time (see athanor.provenance)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from athanor.provenance import environment


def write(result: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # default=str: a value JSON has no type for (a tuple key's repr, a dtype) is written as text rather than losing
    # a run's results at its last line.
    path.write_text(json.dumps({**result, "environment": environment()}, indent=2, default=str) + "\n")
    return path


def result_path(name: str) -> Path:
    """Where a result file goes: under $OUT (a device command's folder that comes back) or bench/results/."""
    return Path(os.environ.get("OUT") or Path(__file__).parent / "results") / name
