"""Credentials a candidate never holds: no capabilities, and a process no one else may inspect.

Workers run as root. A root process with capabilities could read any other process's memory,
`/proc/PID/environ` and `/proc/PID/fd` (the reference worker's key and outputs, the evaluator's
state), or undo its own confinement. `drop_credentials` runs in the worker after everything that
needs a capability (namespaces, mounts, Landlock) and while the process is still single-threaded:
capabilities belong to each thread, so a thread started earlier would keep them.

- every capability is dropped from the effective, permitted, inheritable and ambient sets, and the
  bounding set is emptied, so nothing the worker execs (a compiler, a candidate's subprocess)
  regains one even as uid 0; securebits lock that in where the kernel allows it;
- `PR_SET_DUMPABLE 0`: the kernel then refuses ptrace, `/proc/PID/mem`, `environ` and `fd` of this
  process to every process of its uid without CAP_SYS_PTRACE (every other worker's candidate);
- the ptrace check also refuses a process whose capabilities are not a superset of its target's,
  so a capless candidate cannot read the evaluator (root, full capabilities) either.

CUDA, the NVIDIA driver and Triton need none of these: the device nodes are opened by file mode
(0666 in the images used), Triton runs ptxas and a C compiler as ordinary children, and
`PR_SET_NO_NEW_PRIVS` (set with Landlock) already keeps setuid helpers from gaining privileges.
What the drop does change: uid 0 without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH reads files by their
owner and mode bits like any user, so model files must be readable by their mode to root.
"""

from __future__ import annotations

import ctypes
import errno
from pathlib import Path

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3
PR_SET_SECUREBITS = 28
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
LINUX_CAPABILITY_VERSION_3 = 0x20080522
# NOROOT, NO_SETUID_FIXUP and NO_CAP_AMBIENT_RAISE, each locked, and KEEP_CAPS locked off: uid 0 gains no
# capability at exec, for good.
SECUREBITS_LOCKED_DOWN = 0b1110_1111
CAP_SETS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _err(libc_call: str) -> str:
    e = ctypes.get_errno()
    return f"{libc_call}: {errno.errorcode.get(e, e)}"


def capabilities() -> dict[str, int]:
    """This thread's capability sets from /proc (CapInh, CapPrm, CapEff, CapBnd, CapAmb)."""
    out = {}
    for line in Path("/proc/thread-self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in CAP_SETS:
            out[name] = int(value.strip(), 16)
    return out


def drop_credentials() -> str:
    """Drop every capability and become non-dumpable; one report line saying what holds."""
    libc = ctypes.CDLL(None, use_errno=True)
    errors = []
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    if libc.prctl(PR_SET_SECUREBITS, SECUREBITS_LOCKED_DOWN, 0, 0, 0) != 0:
        errors.append(_err("securebits"))  # a lock, not the drop itself: go on
    for cap in range(last + 1):  # needs CAP_SETPCAP, so before the capset below
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != errno.EINVAL:
            errors.append(_err(f"PR_CAPBSET_DROP {cap}"))
            break
    if libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0:
        errors.append(_err("ambient"))
    header = _CapHeader(LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        errors.append(_err("capset"))
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        errors.append(_err("PR_SET_DUMPABLE"))
    held = {name: value for name, value in capabilities().items() if value}
    dumpable = libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)
    if held or dumpable != 0:
        kept = ", ".join(f"{n} {v:#x}" for n, v in held.items()) or "none"
        return f"credentials: NOT dropped (capabilities kept: {kept}; dumpable {dumpable}; {'; '.join(errors)})"
    note = f" ({'; '.join(errors)})" if errors else ""
    return "credentials: no capabilities (any set, bounding included), not dumpable" + note
