"""A worker's processes as the caller's /proc sees them: the tree, its CPU time, signals to all of it.

Read from the caller's side (the worker's own /proc is a different one), so candidate code cannot
change what is read. A worker launched by `athanor.engine.namespaces` is the only child of its
namespace's init, and every process it or a candidate starts is the init's descendant (orphans are
re-parented to the init, never to a process outside), so the init's descendants are exactly the
processes of the worker.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from athanor.engine.namespaces import WORKER_NS_PID

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    comm: str
    state: str
    ticks: int
    """utime + stime of all its threads."""
    child_ticks: int
    """cutime + cstime: the children it has reaped."""


def children(pid: int) -> list[int]:
    """Live children of `pid` (of all its threads); [] when it is gone."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                out.extend(int(c) for c in (task / "children").read_text().split())
    return out


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid`, parents before their children (not `pid` itself)."""
    out: list[int] = []
    todo = children(pid)
    while todo:
        child = todo.pop(0)
        if child not in out:
            out.append(child)
            todo.extend(children(child))
    return out


def stat(pid: int) -> ProcStat | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()  # fields[0] is field 3 (state) of proc(5)
    return ProcStat(pid, comm, fields[0], int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14]))


def pid_namespace(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return ""


def ns_pid(pid: int) -> int:
    """`pid` as its innermost PID namespace numbers it (0 when it is gone)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    return 0


def find_worker(launched: int) -> tuple[int, int | None] | None:
    """(worker, its namespace's init) for the process a supervisor started; (launched, None) when it runs the
    worker itself (no namespace); None while the launcher has not started the worker yet."""
    own = pid_namespace(launched)
    for init in children(launched):
        if pid_namespace(init) not in ("", own):
            for worker in children(init):
                if ns_pid(worker) == WORKER_NS_PID:
                    return worker, init
            return None
    cmdline = ""
    with contextlib.suppress(OSError):
        cmdline = Path(f"/proc/{launched}/cmdline").read_bytes().decode(errors="replace")
    return None if "athanor.engine.namespaces" in cmdline else (launched, None)


def is_gone(pid: int) -> bool:
    """Exited (a zombie counts: it runs nothing and holds no memory)."""
    st = stat(pid)
    return st is None or st.state in ("Z", "X")
