"""`Supervisor`: spawns an engine worker, times every RPC, and replaces a worker that dies.

The supervisor lives in the caller's process and is itself an `EngineClient`. A request that
kills the worker (segfault, abort, CUDA illegal memory access) or wedges it past its timeout
gets a reply with status "crashed" or "timeout"; before that reply returns, the worker's
process group is killed and a fresh worker is started and given the incumbent, so the next
request finds the engine answering again.

The incumbent is the last candidate swapped in without `keep_incumbent` (a challenger swapped
in beside it does not replace it until the caller swaps it in alone).

Each start gives the worker a fresh request key through a pipe on its stdin (`athanor.engine.auth`);
the supervisor's own client signs with it and `connect()` hands out others. A sandboxed worker runs
in its own PID namespace (`athanor.engine.namespaces`), so stopping it stops every process it
started; `worker_pid`, `signal_all`, `cpu_seconds` and `extra_processes` read and signal that
namespace from this side, for a caller that accounts for or freezes a worker's time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from athanor.engine import auth, procs
from athanor.engine import protocol as p
from athanor.engine.candidate import Candidate, baseline_candidate
from athanor.engine.client import EngineClient, EngineLost, ZmqEngineClient
from athanor.engine.config import EngineConfig
from athanor.engine.namespaces import command
from athanor.errors import EngineDied

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timeouts:
    """Seconds each kind of RPC may take before the worker is declared wedged and killed."""

    start_s: float = 600.0
    """Process start to the first answer (imports and the model load)."""
    swap_s: float = 600.0
    """Import, build, graph capture and the first step of a candidate (torch.compile can be slow)."""
    run_s: float = 120.0
    """One run, generate or measure."""
    other_s: float = 30.0
    """health, stats, activate, drop, shutdown."""

    def for_request(self, request: Any) -> float:
        if isinstance(request, p.SwapRequest):
            return self.swap_s
        if isinstance(request, (p.RunRequest, p.GenerateRequest, p.MeasureRequest)):
            return self.run_s
        return self.other_s


class Supervisor(EngineClient):
    def __init__(self, config: EngineConfig, timeouts: Timeouts | None = None,
                 incumbent: Candidate | None = None) -> None:
        run_dir = Path(tempfile.mkdtemp(prefix="ath-"))  # short: a unix socket path has ~100 bytes
        self.run_dir = run_dir
        self.config = dataclasses.replace(
            config,
            scratch_dir=config.scratch_dir or str(run_dir / "scratch"),
            socket_path=config.socket_path or str(run_dir / "engine.sock"),
        )
        self._owns_run_dir = not config.scratch_dir
        """Remove the run dir (scratch, socket, log) on close unless the caller chose the scratch dir."""
        self.timeouts = timeouts or Timeouts()
        self.incumbent = incumbent or baseline_candidate()
        self.num_respawns = 0
        self.last_start_s = 0.0
        """Seconds from process start to the incumbent built and its first step done, at the last (re)start."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._key = b""
        self._tree: tuple[int, int | None] | None = None
        """(the worker's pid, its namespace's init or None), found once the worker answers."""
        self._client: ZmqEngineClient | None = None
        self._lock = threading.RLock()

    # -- process management ---------------------------------------------------------------------
    @property
    def socket_path(self) -> str:
        """Where other `ZmqEngineClient`s connect to this engine."""
        return self.config.socket_path

    @property
    def log_path(self) -> Path:
        return self.run_dir / "worker.log"

    @property
    def pid(self) -> int | None:
        """The process this supervisor started (the namespace launcher, or the worker itself without one)."""
        return self._proc.pid if self._proc else None

    @property
    def client_key(self) -> bytes:
        """The running worker's request key, for another `ZmqEngineClient`; a new one at every (re)start."""
        return self._key

    def connect(self, timeout_s: float = 60.0) -> ZmqEngineClient:
        """Another client of the running worker (valid until it is respawned: the key changes then)."""
        return ZmqEngineClient(self.socket_path, key=self._key, timeout_s=timeout_s)

    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> float:
        """Start a worker with the incumbent; returns seconds from spawn to its first decode step."""
        with self._lock:
            self._stop_process()
            t0 = time.perf_counter()
            config_path = self.run_dir / "engine.json"
            config_path.write_text(self.config.to_json())
            env = dict(os.environ, **self.config.cache_env())
            env.setdefault("PYTHONUNBUFFERED", "1")
            sandbox = self.config.sandbox
            self._key = auth.new_key()
            with open(self.log_path, "ab") as log_file:
                self._proc = subprocess.Popen(
                    command("athanor.engine.worker", str(config_path), sandbox.enabled and sandbox.namespaces),
                    stdin=subprocess.PIPE, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                    start_new_session=True,  # its own process group: killpg reaches it even without a namespace
                )
            auth.give_key(self._proc, self._key)
            if self._client is None:
                self._client = ZmqEngineClient(self.socket_path, key=self._key)
            else:
                self._client.key = self._key
                self._client.reconnect()
            try:
                self._client.call_checked(p.HealthRequest(), self.timeouts.start_s, self.is_alive)
                reply = self._client.call_checked(p.SwapRequest(self.incumbent), self.timeouts.swap_s, self.is_alive)
                if reply.status != "ok":
                    log.warning("incumbent %s failed to build (%s); starting with the baseline",
                                self.incumbent.id, reply.error.splitlines()[0] if reply.error else reply.status)
                    self.incumbent = baseline_candidate()
                    reply = self._client.call_checked(p.SwapRequest(self.incumbent), self.timeouts.swap_s,
                                                      self.is_alive)
                    if reply.status != "ok":
                        raise EngineDied(f"the engine cannot build the baseline candidate: {reply.error}")
            except EngineLost as e:
                self._stop_process()
                last = self.log_tail(1).strip() or str(e)
                raise EngineDied(f"the engine worker did not start: {last} (log: {self.log_path})") from None
            self.last_start_s = time.perf_counter() - t0
            self._tree = procs.find_worker(self._proc.pid)
            log.info("engine worker %s up in %.2fs with %s", self.worker_pid, self.last_start_s, self.incumbent.id)
            return self.last_start_s

    def respawn(self) -> float:
        """Kill the worker and start a fresh one with the incumbent; returns the seconds it took."""
        with self._lock:
            self.num_respawns += 1
            return self.start()

    def _stop_process(self) -> None:
        proc, self._proc = self._proc, None
        tree, self._tree = self._tree, None
        if proc is None:
            return
        init = tree[1] if tree else None
        if init is not None and proc.poll() is None:
            # The init's exit kills and reaps every process of the namespace; the launcher exits after it.
            with contextlib.suppress(ProcessLookupError):
                os.kill(init, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        elif tree is not None:  # no namespace: the worker's descendants that are still its descendants
            for pid in procs.descendants(tree[0]):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if tree is not None:
            deadline = time.monotonic() + 5
            while not procs.is_gone(tree[0]) and time.monotonic() < deadline:
                time.sleep(0.01)

    # -- the worker's processes, read from this side ------------------------------------------------
    @property
    def worker_pid(self) -> int | None:
        """The pid (in this process's PID namespace) of the running Python worker process itself."""
        if self._tree is None or not self.is_alive() or procs.is_gone(self._tree[0]):
            return None
        return self._tree[0]

    def processes(self) -> list[int]:
        """The worker and every live process it or a candidate started (its namespace's, all but the init)."""
        if self._tree is None or not self.is_alive():
            return []
        worker, init = self._tree
        return procs.descendants(init) if init is not None else [worker, *procs.descendants(worker)]

    def signal_all(self, sig: int) -> None:
        """Send `sig` (SIGSTOP, SIGCONT) to every live process of the worker: its namespace, parents first,
        again until no new process appears (one started between the listing and the signal)."""
        done: set[int] = set()
        for _ in range(20):
            new = [pid for pid in self.processes() if pid not in done]
            if not new:
                return
            for pid in new:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
                done.add(pid)

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of the worker (all threads), its reaped children, the live processes of
        its namespace (and theirs), and the orphans its namespace's init reaped."""
        if self._tree is None:
            return 0.0
        ticks = 0
        init = self._tree[1]
        for pid in self.processes():
            st = procs.stat(pid)
            if st is not None:
                ticks += st.ticks + st.child_ticks
        if init is not None and (st := procs.stat(init)) is not None:
            ticks += st.child_ticks
        return ticks / procs.CLK_TCK

    def extra_processes(self) -> list[str]:
        """Live processes of the worker's namespace other than the worker itself, as "pid comm"."""
        worker = self.worker_pid
        out = []
        for pid in self.processes():
            if pid != worker and (st := procs.stat(pid)) is not None:
                out.append(f"{pid} {st.comm}")
        return out

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- the client interface -------------------------------------------------------------------
    def call(self, request: Any, timeout_s: float | None = None) -> Any:
        with self._lock:
            if not self.is_alive() or self._client is None:
                self.start()
            assert self._client is not None
            timeout = self.timeouts.for_request(request) if timeout_s is None else timeout_s
            try:
                reply = self._client.call_checked(request, timeout, self.is_alive)
            except EngineLost as e:
                status: p.Status = "crashed" if e.reason == "crashed" else "timeout"
                what = self._describe_exit(status, timeout)
                log.warning("engine worker %s on %s: respawning with %s", what, type(request).__name__,
                            self.incumbent.id)
                tail = self.log_tail()
                seconds = self.respawn()
                return p.failure(request, status, f"{what} while handling {type(request).__name__}; "
                                                  f"respawned with {self.incumbent.id} in {seconds:.2f}s\n{tail}")
            if isinstance(request, p.SwapRequest) and reply.status == "ok" and not request.keep_incumbent:
                self.incumbent = request.candidate
            if isinstance(request, p.ShutdownRequest):
                self._wait_exit()
            return reply

    def _describe_exit(self, status: str, timeout: float) -> str:
        if status == "timeout":
            return f"did not answer within {timeout:.1f}s (killed)"
        code = self._proc.poll() if self._proc else None
        if code is not None and code < 0:
            try:
                return f"died of {signal.Signals(-code).name}"
            except ValueError:
                return f"died of signal {-code}"
        return f"exited with status {code}"

    def _wait_exit(self) -> None:
        if self._proc is not None:
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._stop_process()
            self._proc = None

    def close(self) -> None:
        """Stop the worker (politely, then by force) and release the socket."""
        with self._lock:
            if self.is_alive() and self._client is not None:
                try:
                    self._client.call_checked(p.ShutdownRequest(), 5.0, self.is_alive)
                    self._wait_exit()
                except EngineDied:
                    pass
            self._stop_process()
            if self._client is not None:
                self._client.close()
                self._client = None
            if self._owns_run_dir:
                shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
