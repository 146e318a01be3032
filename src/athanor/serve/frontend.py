"""`WorkerHandle`: the front end's side of the serving worker (spawn, submit, stream back, respawn).

Lives in the HTTP process, on its asyncio loop. One zmq DEALER socket (zmq.asyncio) to the
worker's ROUTER; a receiver task routes each `TokenOutput` to the queue of its request, hands
`StepReport`s to the metrics and `DeploymentState`s to the deployment history. A watchdog notices
a worker that died (a candidate that crashed the process, say), ends the requests it held with
an error, and starts a fresh worker with the candidate that was serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
from collections import deque
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from athanor.engine import auth
from athanor.engine.namespaces import command
from athanor.errors import EngineDied
from athanor.serve import messages as m
from athanor.serve.config import WorkerConfig

log = logging.getLogger(__name__)

Event = m.TokenOutput | m.Rejected


class WorkerHandle:
    def __init__(self, config: WorkerConfig, run_dir: Path, *,
                 on_step: Callable[[m.StepReport], None] = lambda r: None,
                 on_deployment: Callable[[m.DeploymentState], None] = lambda d: None) -> None:
        self.config = config
        self.run_dir = run_dir
        self.on_step = on_step
        self.on_deployment = on_deployment
        self.num_respawns = 0
        self.active_candidate = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._key = b""
        self._ctx = zmq.asyncio.Context()
        self._sock: zmq.asyncio.Socket | None = None
        self._queues: dict[str, asyncio.Queue[Event]] = {}
        self._status_waiters: deque[asyncio.Future[m.Status]] = deque()
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Future[None]] = set()
        self._closing = False

    @property
    def log_path(self) -> Path:
        return self.run_dir / "worker.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self, timeout_s: float = 600.0) -> m.Status:
        """Spawn the worker and wait until it answers (model loaded, candidate built)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        config_path = self.run_dir / "worker.json"
        config_path.write_text(json.dumps(self.config.to_dict(), indent=1))
        env = dict(os.environ, **self.config.engine.cache_env())
        env.setdefault("PYTHONUNBUFFERED", "1")
        sandbox = self.config.engine.sandbox
        self._key = auth.new_key()  # a new one per worker: what a candidate read of the last is worthless
        with open(self.log_path, "ab") as log_file:
            self._proc = subprocess.Popen(
                command("athanor.serve.worker", str(config_path), sandbox.enabled and sandbox.namespaces),
                stdin=subprocess.PIPE, stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        auth.give_key(self._proc, self._key)
        if self._sock is None:  # kept across respawns: zmq reconnects to the new worker's socket by itself
            self._sock = self._ctx.socket(zmq.DEALER)
            self._sock.setsockopt(zmq.LINGER, 0)
            self._sock.connect(f"ipc://{self.config.socket_path}")
        if not self._tasks:
            self._tasks = [asyncio.create_task(self._receive()), asyncio.create_task(self._watch())]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            waiter = self._ask_status()
            done, _ = await asyncio.wait({waiter}, timeout=0.5)
            if done:
                status = waiter.result()
                self.active_candidate = status.active_candidate
                log.info("serving worker %s up with %s; KV pool of %d tokens per candidate", self.pid,
                         status.active_candidate, status.kv_pool_tokens)
                return status
            if not self.is_alive() or loop.time() > deadline:
                last = (self.log_tail(1).strip().splitlines() or ["no output"])[-1]
                self._kill()
                raise EngineDied(f"the serving worker did not start: {last.split(': ', 1)[-1]} (log: {self.log_path})")

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    async def close(self) -> None:
        self._closing = True
        if self.is_alive() and self._sock is not None:
            await self._send(m.Shutdown())
            proc = self._proc
            assert proc is not None
            for _ in range(50):
                if proc.poll() is not None:
                    break
                await asyncio.sleep(0.1)
        self._kill()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._sock is not None:
            self._sock.close(linger=0)
        self._ctx.term()

    # -- requests ---------------------------------------------------------------------------------
    async def _send(self, message: object) -> None:
        assert self._sock is not None
        await self._sock.send_multipart(auth.sign(self._key, [m.encode(message)]))

    async def submit(self, request: m.Submit) -> asyncio.Queue[Event]:
        """Queue `request` in the worker; its outputs (or a `Rejected`) arrive on the returned queue."""
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self._queues[request.request_id] = queue
        if not self.is_alive():
            self._queues.pop(request.request_id)
            queue.put_nowait(m.Rejected(request.request_id, "the serving worker is restarting: retry", "queue_full"))
            return queue
        await self._send(request)
        return queue

    async def abort(self, request_id: str) -> None:
        if self._queues.pop(request_id, None) is not None and self.is_alive():
            await self._send(m.Abort(request_id))

    def forget(self, request_id: str) -> None:
        self._queues.pop(request_id, None)

    def _ask_status(self) -> asyncio.Future[m.Status]:
        fut: asyncio.Future[m.Status] = asyncio.get_running_loop().create_future()
        self._status_waiters.append(fut)
        self._soon(self._send(m.StatusQuery()))
        return fut

    def _soon(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)  # held until done: the loop keeps only weak references to tasks
        task.add_done_callback(self._background.discard)

    def abort_soon(self, request_id: str) -> None:
        """`abort` from synchronous code on the loop."""
        self._soon(self.abort(request_id))

    async def status(self, timeout_s: float = 10.0) -> m.Status:
        return await asyncio.wait_for(self._ask_status(), timeout_s)

    async def deploy(self, deploy: m.Deploy) -> None:
        await self._send(deploy)

    @property
    def num_in_flight(self) -> int:
        return len(self._queues)

    # -- background -------------------------------------------------------------------------------
    async def _receive(self) -> None:
        while True:
            sock = self._sock
            assert sock is not None
            try:
                frame = await sock.recv()
            except zmq.ZMQError:
                if self._closing:
                    return
                raise
            try:
                msg = m.decode(frame)
            except m.MessageError as e:
                log.warning("dropped a malformed message from the worker: %s", e)
                continue
            self._dispatch(msg)

    def _dispatch(self, msg: object) -> None:
        if isinstance(msg, m.StepReport):
            self.on_step(msg)
            for out in msg.outputs:
                queue = self._queues.get(out.request_id)
                if queue is not None:
                    queue.put_nowait(out)
                    if out.finish_reason is not None:
                        self._queues.pop(out.request_id, None)
        elif isinstance(msg, m.Rejected):
            queue = self._queues.pop(msg.request_id, None)
            if queue is not None:
                queue.put_nowait(msg)
        elif isinstance(msg, m.Status):
            while self._status_waiters:
                fut = self._status_waiters.popleft()
                if not fut.done():
                    fut.set_result(msg)
                    break
        elif isinstance(msg, m.DeploymentState):
            if msg.phase == "deployed" and msg.candidate_id:
                self.active_candidate = msg.candidate_id
            self.on_deployment(msg)

    async def _watch(self) -> None:
        while not self._closing:
            await asyncio.sleep(0.5)
            if self._closing or self._proc is None or self._proc.poll() is None:
                continue
            code = self._proc.poll()
            tail = self.log_tail(3).strip().splitlines()
            why = f"the serving worker exited with status {code}" + (f" ({tail[-1]})" if tail else "")
            log.error("%s; restarting it with %s", why, self.config.candidate_dir or "the baseline")
            for rid, queue in list(self._queues.items()):
                queue.put_nowait(m.TokenOutput(rid, (), "error", why))
            self._queues.clear()
            self.on_deployment(m.DeploymentState(-1, "", self.active_candidate, "worker_died", why))
            self.num_respawns += 1
            try:
                await self.start()
            except EngineDied as e:
                log.error("%s", e)
                await asyncio.sleep(5.0)

    def serve_candidate_dir(self, candidate_dir: str) -> None:
        """The candidate a respawned worker starts with (after a deploy passed)."""
        self.config = dataclasses.replace(self.config, candidate_dir=candidate_dir)
