"""A worker's own PID and mount namespaces: nothing it starts or writes outside its scratch outlives it.

`python -m athanor.engine.namespaces MODULE CONFIG.json` (the launcher, the process a supervisor
starts) unshares a PID and a mount namespace, makes every mount private to it, and forks the new
namespace's init, which forks and execs `python -m MODULE CONFIG.json`, the worker. Three
processes, each for a reason:

- the launcher stays in the caller's PID namespace (a process cannot enter the PID namespace it
  creates), waits for the init, ends it when the caller is gone, and exits the way the worker did
  (the same signal or status), so a caller sees a worker's death as before;
- the init is PID 1 of the namespace: when it exits, for any reason, the kernel kills every
  process left in the namespace, including children a candidate detached with setsid or a double
  fork, and every orphan is re-parented to it (and reaped), never to a process outside;
- the worker is PID 2, not PID 1: the kernel ignores signals a namespace's init sends itself
  without a handler, so as PID 1 a candidate's `os.abort()` would not end the worker.

The worker then calls `private_mounts` before its sandbox: a new /proc (it sees only its own
namespace's processes), tmpfs on /dev/shm and on its TMPDIR (gone with the namespace), and the
compile cache (`EngineConfig.trusted`): a trusted worker writes the shared cache; an untrusted one
sees it read-only through an overlay whose writable layer is a tmpfs gone with it. A mount is made
only in a mount namespace verified to be new and private (never on the caller's /dev/shm).

Where `unshare` is refused the launcher execs the worker directly and the worker's report says
NOT for each mechanism it lacks.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import select
import shutil
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from athanor.engine.config import EngineConfig

LAUNCH_ENV = "ATHANOR_LAUNCH"
"""What the launcher did, for the worker's report and its check before mounting (JSON)."""
CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG = 1
WORKER_NS_PID = 2
"""The worker's pid inside its namespace: the init's first and only fork."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _errno_name() -> str:
    e = ctypes.get_errno()
    return errno.errorcode.get(e, str(e))


def command(module: str, config_path: str, namespaces: bool) -> list[str]:
    """The argv that starts `module` (a worker's `__main__`) in its own namespaces, or directly."""
    if namespaces:
        return [sys.executable, "-m", "athanor.engine.namespaces", module, config_path]
    return [sys.executable, "-m", module, config_path]


# -- the launcher and the namespace's init ------------------------------------------------------
def _stdin_to_devnull() -> None:
    """Only the worker reads the key on stdin; the launcher and the init let go of the pipe."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


def _init(target: list[str], env: dict[str, str], alive_r: int, status_w: int) -> None:
    """PID 1 of the namespace: start the worker, reap every orphan, report the worker's end, exit."""
    libc = _libc()
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if select.select([alive_r], [], [], 0)[0]:  # the launcher died before the line above took effect
        os._exit(1)
    worker = os.fork()
    if worker == 0:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        os.execve(sys.executable, target, env)
    _stdin_to_devnull()
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(1)
        if pid == worker:
            os.write(status_w, status.to_bytes(4, "little", signed=True))
            os._exit(0)  # the kernel now kills what is left in the namespace


def _exit_like(status: int) -> int:
    """Exit as the worker did: by its signal (so the caller reads 'died of SIGSEGV') or with its code."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the worker's crash, not a core of ours
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 128 + sig
    return os.waitstatus_to_exitcode(status)


def _wait_for(init: int, parent: int) -> None:
    """Until `init` exits; kill it if the caller (`parent`) goes first."""
    try:
        pidfd = os.pidfd_open(init)
    except (AttributeError, OSError):
        pidfd = -1
    while True:
        if pidfd >= 0:
            if select.select([pidfd], [], [], 0.5)[0]:
                return
        elif os.waitid(os.P_PID, init, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return
        else:
            select.select([], [], [], 0.1)
        if os.getppid() != parent:  # the caller is gone: so is its worker
            os.kill(init, signal.SIGKILL)


def launch(module: str, config_path: str) -> int:
    target = [sys.executable, "-m", module, config_path]
    libc = _libc()
    info: dict[str, object] = {"host_mnt_ns": os.stat("/proc/self/ns/mnt").st_ino, "pid_ns": False,
                               "mount_ns": False, "error": ""}
    if libc.unshare(CLONE_NEWPID | CLONE_NEWNS) == 0:
        info.update(pid_ns=True, mount_ns=True)
    else:
        info["error"] = f"unshare(PID|mount): {_errno_name()}"
        if libc.unshare(CLONE_NEWPID) == 0:
            info["pid_ns"] = True
    if info["mount_ns"] and libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        # Mounts that could propagate back to the caller's namespace must not be made at all.
        info.update(mount_ns=False, error=f"mount --make-rprivate /: {_errno_name()}")
    env = dict(os.environ, **{LAUNCH_ENV: json.dumps(info)})
    if not info["pid_ns"]:
        os.execve(sys.executable, target, env)
    alive_r, alive_w = os.pipe()
    status_r, status_w = os.pipe()
    parent = os.getppid()
    init = os.fork()
    if init == 0:
        os.close(alive_w)
        os.close(status_r)
        _init(target, env, alive_r, status_w)
    os.close(alive_r)
    os.close(status_w)
    _stdin_to_devnull()
    _wait_for(init, parent)
    _, init_status = os.waitpid(init, 0)
    raw = os.read(status_r, 4)
    return _exit_like(int.from_bytes(raw, "little", signed=True) if len(raw) == 4 else init_status)


# -- inside the worker, before its sandbox ------------------------------------------------------
def _mount(source: str, target: Path, fstype: str, flags: int, data: str = "") -> str:
    """'' when mounted, else the errno's name."""
    ok = _libc().mount(source.encode(), str(target).encode(), fstype.encode(), flags,
                       data.encode() if data else None) == 0
    return "" if ok else _errno_name()


def launch_info() -> dict[str, object]:
    """What the launcher did (empty when the worker was started directly); read once, at boot."""
    raw = os.environ.pop(LAUNCH_ENV, "")
    return dict(json.loads(raw)) if raw else {}


def private_mounts(config: EngineConfig, info: dict[str, object]) -> tuple[list[str], Path]:
    """Mount what is the worker's alone; returns its report lines and the compile cache root to use."""
    scratch = Path(config.scratch_dir)
    shared = config.compile_cache_dir()
    pid_ns = bool(info.get("pid_ns")) and os.getpid() == WORKER_NS_PID
    private = bool(info.get("mount_ns")) and os.stat("/proc/self/ns/mnt").st_ino != info.get("host_mnt_ns")
    why = str(info.get("error") or "not started through athanor.engine.namespaces")
    lines = ["processes: in its own PID namespace: every process it starts dies with it" if pid_ns else
             f"processes: NOT in a PID namespace ({why}): a process that leaves its group can outlive it"]
    if private:
        failed = []
        steps = [("/proc", lambda: _mount("proc", Path("/proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
                  if pid_ns else "no PID namespace"),
                 ("/dev/shm", lambda: _mount("tmpfs", Path("/dev/shm"), "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")),
                 ("TMPDIR", lambda: _mount("tmpfs", scratch / "tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=700"))]
        (scratch / "tmp").mkdir(parents=True, exist_ok=True)
        for name, step in steps:
            if error := step():
                failed.append(f"{name}: {error}")
        lines.append("mounts: private; a new /proc, tmpfs on /dev/shm and TMPDIR (gone with the worker)"
                     if not failed else f"mounts: private, but NOT {', '.join(failed)}")
    else:
        lines.append(f"mounts: NOT private ({why}): /dev/shm and TMPDIR outlive the worker")
    line, root = _compile_cache(config, shared, scratch, private)
    return [*lines, line], root


def _compile_cache(config: EngineConfig, shared: Path, scratch: Path, private: bool) -> tuple[str, Path]:
    """Only a trusted worker (one that never imports candidate code) writes the shared cache: Triton and
    Inductor load a cached binary by its key without checking it, so a planted entry would run in every
    worker and server that shares the cache."""
    if config.trusted:
        return f"compile cache: {shared} shared, writable (a trusted worker)", shared
    shared.mkdir(parents=True, exist_ok=True)
    merged = scratch / "compile-cache"
    layers = scratch / "compile-cache-rw"
    if not private:
        shutil.rmtree(merged, ignore_errors=True)  # nothing an earlier worker wrote is loaded by this one
        merged.mkdir(parents=True)
        return ("compile cache: NOT shared (no private mount namespace): a private empty cache under scratch",
                merged)
    merged.mkdir(parents=True, exist_ok=True)
    layers.mkdir(parents=True, exist_ok=True)
    if error := _mount("tmpfs", layers, "tmpfs", MS_NOSUID | MS_NODEV, "mode=700"):
        return f"compile cache: NOT shared (tmpfs for its writes: {error}): a private empty cache under scratch", merged
    (layers / "upper").mkdir()
    (layers / "work").mkdir()
    options = f"lowerdir={shared},upperdir={layers / 'upper'},workdir={layers / 'work'}"
    if not (error := _mount("overlay", merged, "overlay", MS_NOSUID | MS_NODEV, options)):
        return f"compile cache: {shared} read-only (overlay); its own writes in a tmpfs gone with it", merged
    bind = _mount(str(layers / "upper"), merged, "", MS_BIND)
    return (f"compile cache: NOT shared (overlay: {error}): a private empty cache "
            + ("gone with the worker" if not bind else "under scratch"), merged)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.stderr.write("usage: python -m athanor.engine.namespaces MODULE CONFIG.json\n")
        sys.exit(2)
    sys.exit(launch(sys.argv[1], sys.argv[2]))
