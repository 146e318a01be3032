"""What every benchmark record carries, and where it is written.

A record is one JSON object: the benchmark's figures plus its provenance (`provenance`): the date, the git
commit, the device and GPU names, the torch, Triton and Python versions, the threads and host
(`athanor.provenance.environment`), and the command line that produced it. Figures are only comparable
with their provenance, so a record is stamped when it is made, not when it is written.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import torch

from athanor.model.device import resolve_device
from athanor.provenance import environment


def provenance(device: str | torch.device | None = None) -> dict[str, Any]:
    """The provenance fields of a record made on `device` (default: CUDA when present)."""
    return {**environment(device), "command": command_line()}


def command_line() -> str:
    """This process's command line, `athanor ...` however the CLI was started (script, `python -m athanor`)."""
    program = Path(sys.argv[0]).name if sys.argv else ""
    args = sys.argv[1:] if program in ("athanor", "__main__.py") else sys.argv
    return shlex.join(["athanor", *args] if program in ("athanor", "__main__.py") else args)


def default_device(name: str | None = None) -> str:
    """`name` checked (a one-line error for a device this machine lacks), or, when empty, CUDA when present, else
    the CPU."""
    return str(resolve_device(name or None))


def default_dtype(device: str, dtype: str = "") -> str:
    """`dtype`, or the benchmarks' default on `device`: bfloat16 on CUDA, float32 on the CPU (which lacks fast bf16
    paths for most ops)."""
    return dtype or ("bfloat16" if torch.device(device).type == "cuda" else "float32")


def write_record(record: dict[str, Any], path: str | Path | None) -> Path | None:
    """Write `record` as JSON to `path` (its folder made); nothing when `path` is empty. Returns where it went."""
    if not path:
        return None
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    # default=str: a value JSON has no type for (a dtype, a tuple key's repr) is written as text rather than losing
    # a finished benchmark's figures at its last line.
    out.write_text(json.dumps(record, indent=2, default=str) + "\n")
    return out


def written(out: Path | None) -> str:
    """The suffix a summary line ends with: where its record went, if anywhere."""
    return f"  -> {out}" if out else ""
