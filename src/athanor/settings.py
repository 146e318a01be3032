"""Process-level settings: the only environment variables athanor reads, one documented line each.

What a forward pass does is never set here: every tunable of a candidate is an option of the move catalog
(`athanor.moves`) or a keyword parameter of a kernel, which the search sets and the candidate records. These are
where a process keeps its files and what it records as its source; each is read when asked for, so a test or a
child process may set it after import.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE = "ATHANOR_CACHE"
"""The directory athanor keeps across runs (models, device locks, cost records); else $XDG_CACHE_HOME/athanor,
else ~/.cache/athanor."""

COMMIT = "ATHANOR_COMMIT"
"""The commit a tree copied without its .git (e.g. onto a lent GPU) records as its source: the hash itself."""


def cache_dir() -> Path:
    """The directory named by `CACHE`, else the user's cache directory's athanor/."""
    if value := os.environ.get(CACHE):
        return Path(value)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "athanor"


def commit() -> str | None:
    """The commit named by `COMMIT`, or None where unset (then git is asked)."""
    return os.environ.get(COMMIT) or None
