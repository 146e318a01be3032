"""The compile loop on a Ray cluster (`athanor compile --cluster ADDRESS`): screening fanned out, confirming reserved.

The compile session stays one process (agents, the board, the budget, the store); what it fans out is the fast
tier's screening, and once the search is over, the slow tier's confirmation goes to a worker of the cluster it
reserves (the screeners stopped first, so the confirmation has a device and a core to itself). Each screener is a
Ray actor holding a persistent `Evaluator` (its engine workers stay up between candidates, so a screen costs swaps,
not cold starts): one actor per GPU of the cluster, or per CPU where it has none, each pinned to one core of its
node. Ray places them (one GPU or CPU bundle each, spread over the nodes), restarts one whose process dies, and a
candidate whose screen was lost with it goes back on the queue.

The sandbox holds: an actor is a supervisor like the session's own evaluator. Candidate code runs only in the engine
workers it starts, which hold no Ray connection (their descriptors are closed at spawn) and enter their own
namespaces, Landlock domain and empty network namespace before any candidate is imported.

Ray is imported only here, and only for `--cluster`; without it a run on one machine is unchanged.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from dataclasses import dataclass
from typing import Any

from athanor.engine.candidate import Candidate
from athanor.errors import ConfigError
from athanor.evaluate.config import EvaluateConfig
from athanor.evaluate.verdict import Verdict

log = logging.getLogger(__name__)

LOST_SCREENS_MAX = 3
"""Times one candidate's screen may be lost with its actor before the session gives up on it."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("--cluster: Ray is not installed here; pip install 'athanor[cluster]'") from None
    return ray


def connect(address: str) -> Any:
    """Join the cluster at `address` (`auto`: the one this process runs in, or RAY_ADDRESS; `HOST:PORT`;
    `ray://HOST:PORT` through Ray Client); the ray module."""
    ray = _ray()
    if not ray.is_initialized():
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise ConfigError(f"--cluster {address}: cannot join the Ray cluster ({e})") from None
    return ray


@dataclass(frozen=True)
class Placement:
    """Where a screener runs."""

    node_id: str
    pid: int
    core: int | None
    gpu_ids: tuple[int, ...]
    visible_devices: str


class _Screener:
    """A Ray actor: one fast-tier `Evaluator` kept across candidates."""

    def __init__(self, config: EvaluateConfig, core: int | None) -> None:
        if core is not None:
            os.sched_setaffinity(0, {core})  # the engine workers it starts inherit the core
        self.core = core
        from athanor.evaluate.cascade import Evaluator

        self.evaluator = Evaluator(config)

    def placement(self) -> Placement:
        import ray

        ctx = ray.get_runtime_context()
        return Placement(ctx.get_node_id(), os.getpid(), self.core, tuple(int(g) for g in ray.get_gpu_ids()),
                         os.environ.get("CUDA_VISIBLE_DEVICES", ""))

    def screen(self, candidate: Candidate, baseline: Candidate) -> Verdict:
        return self.evaluator.evaluate(candidate, baseline)

    def close(self) -> None:
        self.evaluator.close()


class ScreenPool:
    """Screeners on the cluster, fed one candidate at a time: `submit` queues a screen, which starts as soon as a
    screener is free, and `next` waits for the first verdict to come, so no screener waits on another's screen."""

    def __init__(self, address: str, config: EvaluateConfig) -> None:
        self.ray = ray = connect(address)
        gpu = config.device.startswith("cuda")
        resources = ray.cluster_resources()
        count = int(resources.get("GPU", 0) if gpu else resources.get("CPU", 0))
        if count < 1:
            raise ConfigError(f"--cluster {address}: the cluster offers no {'GPU' if gpu else 'CPU'} for a screener")
        remote = ray.remote(num_gpus=1, num_cpus=0)(_Screener) if gpu else ray.remote(num_cpus=1)(_Screener)
        cores = len(os.sched_getaffinity(0))
        self._remote, self._cores = remote, cores
        self.actors = [self._actor(config, i) for i in range(count)]
        self.placements: list[Placement] = ray.get([a.placement.remote() for a in self.actors])
        self._queue: deque[tuple[Candidate, Candidate]] = deque()
        self._running: dict[Any, tuple[int, Candidate, Candidate]] = {}
        self._idle = list(range(count))
        self._tries: dict[str, int] = {}

    def _actor(self, config: EvaluateConfig, i: int) -> Any:
        gpu = config.device.startswith("cuda")
        return self._remote.options(max_restarts=2, max_task_retries=0, scheduling_strategy="SPREAD").remote(
            config, None if gpu else i % self._cores)

    def __len__(self) -> int:
        return len(self.actors)

    @property
    def free(self) -> int:
        """Screeners that a candidate submitted now would start on at once."""
        return 0 if self._queue else len(self._idle)  # a queued screen waits only while every screener is busy

    @property
    def in_flight(self) -> int:
        """Screens submitted whose verdicts have not come yet."""
        return len(self._queue) + len(self._running)

    def submit(self, candidate: Candidate, baseline: Candidate) -> None:
        """Screen `candidate` against `baseline` on the next free screener."""
        self._queue.append((candidate, baseline))
        self._dispatch()

    def _dispatch(self) -> None:
        while self._queue and self._idle:
            i, (cand, baseline) = self._idle.pop(), self._queue.popleft()
            self._running[self.actors[i].screen.remote(cand, baseline)] = (i, cand, baseline)

    def next(self) -> tuple[Candidate, Verdict]:
        """The first verdict to come of those in flight. A screen lost with its actor (the process died: Ray restarts
        the actor) comes as a "worker-lost" verdict naming the screener, and the candidate is queued again, first."""
        ray = self.ray
        done, _ = ray.wait(list(self._running), num_returns=1)
        i, cand, baseline = self._running.pop(done[0])
        self._idle.append(i)
        try:
            verdict = ray.get(done[0])
        except ray.exceptions.RayActorError as e:
            self._tries[cand.id] = self._tries.get(cand.id, 0) + 1
            where = self.placements[i]
            who = f"screener {i} (pid {where.pid} on node {where.node_id[:12]})"
            log.warning("%s died screening %s (%s): screening it again", who, cand.id, str(e).splitlines()[0])
            if self._tries[cand.id] >= LOST_SCREENS_MAX:
                raise ConfigError(f"--cluster: the screen of {cand.id} was lost with its actor "
                                  f"{LOST_SCREENS_MAX} times") from None
            self._refresh(i)
            self._queue.appendleft((cand, baseline))
            self._dispatch()
            return cand, Verdict(cand.id, baseline.id, False, "worker-lost", f"{who} died during the screen; "
                                 "screened again on another", status="error")
        self._dispatch()
        return cand, verdict

    def confirmer(self, config: EvaluateConfig) -> Confirmer:
        """Stop the screeners (the search is over) and reserve a worker of the cluster for the slow tier `config`."""
        self.close()
        self.actors = [self._actor(config, 0)]
        self.placements = [self.ray.get(self.actors[0].placement.remote())]
        return Confirmer(self, config)

    def _refresh(self, i: int) -> None:
        """Where screener `i` runs once Ray has restarted it (a new process, perhaps on another node)."""
        try:
            self.placements[i] = self.ray.get(self.actors[i].placement.remote(), timeout=300)
        except Exception as e:  # it did not come back: its next screen fails the same way and is queued again
            log.warning("screener %d did not come back: %s", i, e)

    def close(self) -> None:
        """Stop every screener's engines, all at once, then the actors."""
        closing = [actor.close.remote() for actor in self.actors]
        for ref in closing:
            try:
                self.ray.get(ref, timeout=60)
            except Exception as e:  # an actor that is already gone has nothing to close
                log.debug("closing a screener: %s", e)
        for actor in self.actors:
            self.ray.kill(actor)
        self.actors, self._idle = [], []
        self._running.clear()
        self._queue.clear()


class Confirmer:
    """The slow tier on the worker a `ScreenPool` reserved: `evaluate` as an `Evaluator`'s, the verdict of a
    confirmation lost with its worker (Ray restarts it) being the next attempt's."""

    def __init__(self, pool: ScreenPool, config: EvaluateConfig) -> None:
        self.pool, self.config = pool, config

    @property
    def where(self) -> str:
        p = self.pool.placements[0]
        return f"pid {p.pid} on node {p.node_id[:12]}"

    def evaluate(self, candidate: Candidate, incumbent: Candidate) -> Verdict:
        for attempt in range(1, LOST_SCREENS_MAX + 1):
            try:
                return self.pool.ray.get(self.pool.actors[0].screen.remote(candidate, incumbent))
            except self.pool.ray.exceptions.RayActorError as e:
                log.warning("the confirming worker (%s) died confirming %s (%s): attempt %d of %d", self.where,
                            candidate.id, str(e).splitlines()[0], attempt, LOST_SCREENS_MAX)
                self.pool._refresh(0)
        raise ConfigError(f"--cluster: the confirmation of {candidate.id} was lost with its worker {LOST_SCREENS_MAX} "
                          "times")

    def close(self) -> None:
        self.pool.close()
