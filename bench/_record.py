"""What every benchmark JSON carries: machine, versions, commit, time (see athanor.provenance)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from athanor.provenance import environment


def write(result: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**result, "environment": environment()}, indent=2) + "\n")
    return path
