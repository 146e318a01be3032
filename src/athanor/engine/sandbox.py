"""The worker's sandbox, enforced by the kernel: a network namespace, Landlock, RLIMIT_DATA.

`enter_sandbox` runs first thing in the worker process, while it is still single-threaded
(before torch is imported): a new user namespace cannot be entered by a multi-threaded
process, and Landlock restricts the calling thread and the threads it creates afterwards, so
every thread the worker ever runs is confined. Nothing here is a Python-level check a
candidate could walk around; `athanor.engine.violations` only *reports* attempts.

- network: `unshare(CLONE_NEWNET)` (as root), else `CLONE_NEWUSER | CLONE_NEWNET`; the new
  namespace has only a loopback that is down. Landlock (ABI >= 4) also refuses TCP bind/connect.
  A layout group's rank 0 brings that loopback up and leaves TCP to the namespace instead: its
  other ranks, started inside it (`athanor.engine.group`), connect to it there, and nothing
  outside the namespace can be reached from it.
- filesystem: Landlock refuses every write, create, remove, rename and truncate outside the
  writable directories (scratch, /dev incl. /dev/shm, /proc/self, and the shared compile cache for
  a trusted worker only). Reads stay open.
- signals and abstract unix sockets: Landlock scopes (ABI >= 6), so a candidate cannot signal
  or connect to processes outside its sandbox (e.g. the supervisor).
- memory: RLIMIT_DATA (RLIMIT_AS would break CUDA's address-space reservations).

Where a mechanism is missing the report says so; the worker logs it once at start.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import resource
import socket
import struct
from collections.abc import Sequence
from pathlib import Path

from athanor.engine.config import SandboxConfig

log = logging.getLogger(__name__)

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
PR_SET_NO_NEW_PRIVS = 38

# Landlock syscalls share numbers on x86_64 and aarch64 (generic syscall table).
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1

# Filesystem rights that change something (reads and execute stay unhandled, hence allowed).
FS_WRITE_FILE = 1 << 1
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when Landlock is unavailable."""
    r = _libc().syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                        ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return max(int(r), 0)


def _loopback_up() -> str:
    """Bring up the new namespace's loopback, which is all a layout group's ranks need to reach each other."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            flags = struct.unpack("16sH14s", fcntl.ioctl(s, siocgifflags, struct.pack("16sH14s", b"lo", 0, b"")))[1]
            fcntl.ioctl(s, siocsifflags, struct.pack("16sH14s", b"lo", flags | iff_up, b""))
    except OSError as e:
        return f"; its loopback NOT up ({e.strerror})"
    return ", its loopback up for the layout group's ranks"


def _enter_network_namespace(loopback: bool) -> str:
    libc = _libc()
    if libc.unshare(CLONE_NEWNET) == 0:
        return "network: isolated (new network namespace" + (_loopback_up() if loopback else "") + ")"
    first = ctypes.get_errno()
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        # Map our own ids into the new user namespace so files keep their owners.
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with contextlib.suppress(OSError):
                Path(f"/proc/self/{name}").write_text(text)
        return "network: isolated (new user + network namespace" + (_loopback_up() if loopback else "") + ")"
    second = ctypes.get_errno()
    return (f"network: NOT isolated (unshare: {errno.errorcode.get(first, first)}, "
            f"with a user namespace: {errno.errorcode.get(second, second)})")


def _apply_landlock(writable: Sequence[Path], abi: int, tcp: bool) -> list[str]:
    """`tcp`: leave TCP to the network namespace (a layout group's ranks connect over its loopback)."""
    libc = _libc()
    fs = (FS_WRITE_FILE | FS_REMOVE_DIR | FS_REMOVE_FILE | FS_MAKE_CHAR | FS_MAKE_DIR | FS_MAKE_REG
          | FS_MAKE_SOCK | FS_MAKE_FIFO | FS_MAKE_BLOCK | FS_MAKE_SYM)
    if abi >= 2:
        fs |= FS_REFER
    if abi >= 3:
        fs |= FS_TRUNCATE
    attr = _RulesetAttr(fs, NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 and not tcp else 0,
                        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8  # the struct grew with the ABI
    ruleset = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    allowed: list[str] = []
    try:
        for path in writable:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                rule = _PathBeneathAttr(fs, fd)
                if libc.syscall(SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
                                ctypes.byref(rule), ctypes.c_uint32(0)) == 0:
                    allowed.append(str(path))
            finally:
                os.close(fd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    lines = [f"filesystem: writes only under {', '.join(allowed)} (Landlock ABI {abi})"]
    lines.append("tcp: left to the network namespace (the layout group's ranks talk over its loopback)" if tcp
                 else "tcp: bind/connect refused (Landlock)" if abi >= 4 else "tcp: NOT blocked by Landlock (ABI < 4)")
    lines.append("signals: scoped to the sandbox (Landlock)" if abi >= 6
                 else "signals: NOT scoped (Landlock ABI < 6)")
    return lines


def _memory_limit(config: SandboxConfig) -> str:
    limit = config.memory_limit_bytes
    if limit < 0:
        return "memory: NOT limited (memory_limit_bytes = -1)"
    if limit == 0:
        limit = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.9)
    try:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    except (ValueError, OSError) as e:
        return f"memory: NOT limited (setrlimit RLIMIT_DATA: {e})"
    return f"memory: RLIMIT_DATA {limit / 2**30:.1f} GiB"


def enter_sandbox(config: SandboxConfig, writable: Sequence[Path], loopback: bool = False) -> tuple[str, ...]:
    """Confine this process; returns one line per mechanism saying what is (or is not) enforced.

    Call it while the process is single-threaded. `writable` directories are created first. `loopback`: the
    process will start a layout group's other ranks, which connect to it over TCP on the namespace's loopback.
    """
    if not config.enabled:
        return ("sandbox: DISABLED (trusted candidates only)",)
    lines: list[str] = []
    if config.network:
        lines.append(_enter_network_namespace(loopback))
    else:
        lines.append("network: NOT isolated (disabled in the config)")
    if config.filesystem:
        dirs = []
        for path in writable:
            path = Path(path)
            path.mkdir(parents=True, exist_ok=True)
            dirs.append(path.resolve())
        abi = landlock_abi()
        if abi == 0:
            lines.append("filesystem: NOT confined (this kernel has no Landlock)")
        else:
            try:
                lines.extend(_apply_landlock(dirs, abi, tcp=loopback))
            except OSError as e:
                lines.append(f"filesystem: NOT confined (Landlock failed: {e})")
    else:
        lines.append("filesystem: NOT confined (disabled in the config)")
    lines.append(_memory_limit(config))
    return tuple(lines)


def default_writable(scratch_dir: Path, socket_dir: Path, shared_cache: Path | None = None) -> list[Path]:
    """Where a worker may write: its scratch (its own compile cache included), its socket, devices, its own
    /proc entry, and the shared compile cache only where given (a trusted worker's)."""
    own_proc = Path("/proc") / os.readlink("/proc/self")  # its pid as the mounted /proc numbers it
    return [scratch_dir, *([shared_cache] if shared_cache else []), socket_dir, Path("/dev"), own_proc]
