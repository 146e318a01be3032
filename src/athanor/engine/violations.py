"""`ViolationWatch`: *reports* a candidate's attempts to leave its sandbox.

The kernel enforces the sandbox (see `sandbox.py`); a candidate that catches the resulting
PermissionError could otherwise hide that it tried. A Python audit hook, armed only while
candidate code runs, records writes outside the writable directories and internet sockets,
so the verdict can say "violation". It cannot be removed once installed, but it is a witness,
not the wall: a candidate that avoids Python's I/O (ctypes syscalls) still hits the kernel.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {"os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.truncate", "os.chmod", "os.chown",
                "os.link", "os.symlink", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move"}
_SOCKET_EVENTS = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"}
_MAX_EVENTS = 20


class ViolationWatch:
    def __init__(self, writable: Sequence[str]) -> None:
        self._writable = tuple(os.path.realpath(p).rstrip("/") + "/" for p in writable)
        self._armed = False
        self._events: list[str] = []
        self.total = 0
        sys.addaudithook(self._hook)

    @contextmanager
    def armed(self) -> Iterator[None]:
        """Record while the body (candidate code) runs."""
        self._armed = True
        try:
            yield
        finally:
            self._armed = False

    def take(self) -> list[str]:
        """The attempts recorded since the last call."""
        events, self._events = self._events, []
        return events

    def _allowed(self, path: Any, dir_fd: Any = None) -> bool:
        if isinstance(path, int):
            return True  # an fd the process already holds
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        path = str(path)
        if isinstance(dir_fd, int) and not os.path.isabs(path):
            # shutil.rmtree (Triton's and Inductor's temp dirs) removes names relative to a directory fd.
            path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
        full = os.path.realpath(os.path.abspath(path))
        return any((full + "/").startswith(w) for w in self._writable)

    def _record(self, what: str) -> None:
        self.total += 1
        if len(self._events) < _MAX_EVENTS and what not in self._events:
            self._events.append(what)

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if not self._armed:
            return
        self._armed = False  # the checks below must not audit themselves
        try:
            if event == "open" and len(args) >= 3:
                path, mode, flags = args[0], args[1], args[2]
                writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                    isinstance(flags, int) and flags & _WRITE_FLAGS)
                if writing and not self._allowed(path):
                    self._record(f"write outside the scratch directory: {path!s}")
            elif event in ("os.remove", "os.rmdir"):  # (path, dir_fd)
                if args and not self._allowed(*args[:2]):
                    self._record(f"{event} outside the scratch directory: {args[0]!s}")
            elif event == "os.mkdir" and len(args) >= 3 and args[2] in (None, -1) and \
                    isinstance(args[0], (str, bytes, os.PathLike)) and os.path.isdir(args[0]):
                pass  # (path, mode, dir_fd): an existing directory creates nothing (Inductor's `Path(".").mkdir()`)
            elif event in _PATH_EVENTS and args and not all(self._allowed(a) for a in args[:2]
                                                             if isinstance(a, (str, bytes, os.PathLike))):
                self._record(f"{event} outside the scratch directory: {args[0]!s}")
            elif event in _SOCKET_EVENTS and args and getattr(args[0], "family", None) in (
                    socket.AF_INET, socket.AF_INET6):
                self._record(f"network: {event} {args[1]!r}" if len(args) > 1 else f"network: {event}")
            elif event == "socket.__new__" and len(args) >= 2 and args[1] in (socket.AF_INET, socket.AF_INET6):
                self._record("network: opened an internet socket")
        except Exception:  # a witness must never break the code it watches
            pass
        finally:
            self._armed = True
