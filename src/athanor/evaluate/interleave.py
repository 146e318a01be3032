"""An interleaved trajectory driven from the evaluator's process, one step at a time, across worker processes.

The incumbent, its twin and the challenger each run in a worker of their own (on a GPU the twin shares the
incumbent's; `TierEngines`): a challenger cannot reach, patch or slow the residents it is compared with. Each
timed or warm-up step runs once per side in a seeded random order (never starting with the side that ended the
previous step); a set-up step (`Script.setup`: context that is neither timed nor warm-up) runs on every worker
at once. Around every run of a timed or warm-up step:

- only the worker whose turn it is may run: every other worker of the trajectory is stopped (SIGSTOP to all its
  processes), so no thread or child of a challenger can compute ahead, or take a core from the incumbent while
  the incumbent is timed; and every turn wakes its worker from a stop, the one that just ran too, so every side
  pays the same wake-up;
- the step's inputs are sent when its turn comes, and its next tokens (the following step's inputs) only with
  the following request, once this step's outputs have left the worker;
- the evaluator's own clock, outside every worker, times the request from send to reply. On a CPU that is the
  step's time (the request's overhead is the engine's, alike for every side). On CUDA the worker's device events
  are the finer measure, cross-checked: a side's time is at least its outside time less the trusted sides'
  median overhead, so a worker that under-reports gains nothing;
- a worker's CPU time over the trajectory (all its threads and processes) must fit the wall time of its turns
  at the threads it was given, else the trajectory is refused: work on extra threads counts or is refused.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import torch

from athanor.engine import protocol as p
from athanor.engine.group import group_size
from athanor.engine.supervisor import Supervisor
from athanor.evaluate.scripts import Script

log = logging.getLogger(__name__)

_clock = time.perf_counter
CPU_SLACK_S = 0.05
"""CPU seconds a worker may spend beyond its turns' wall time times its threads: clock-tick rounding
(10 ms per reading) and the waking and stopping around each turn."""


@dataclass(frozen=True)
class Side:
    """One timed side of a trajectory: a resident of a worker."""

    candidate_id: str
    worker: Supervisor
    trusted: bool
    """The incumbent and its twin: their overheads calibrate the outside clock's cross-check."""


class Refused(Exception):
    """The trajectory broke a rule of the interleaving (CPU time beyond its turns, a worker that would not stop)."""


def _order(rng: random.Random, n: int, last: int | None) -> list[int]:
    while True:
        perm = rng.sample(range(n), n)
        if n == 1 or perm[0] != last:
            return perm


def _stopped(pid: int) -> bool:
    """Every thread of `pid` stopped (state T or t)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("T", "t", "Z", "X"):
            return False
    return True


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _stop(pids: list[int], deadline_s: float = 2.0) -> None:
    """SIGSTOP to `pids` (a worker's processes, the worker first), waiting until the worker has stopped."""
    _signal(pids, signal.SIGSTOP)
    t = _clock()
    while pids and not _stopped(pids[0]):
        if _clock() - t > deadline_s:
            raise Refused(f"worker {pids[0]} did not stop within {deadline_s:.0f} s of SIGSTOP")
        time.sleep(0)


def run_interleaved(sides: Sequence[Side], script: Script, seed: int, timeout_s: float, *,
                    logits_of: Sequence[int] = (), threads: int = 1, device_clock: bool = False,
                    num_projections: int = 8, hold: Sequence[Supervisor] = ()) -> p.TrajectoryReply:
    """Run `script` on every side, interleaved per step (see the module docstring).

    `logits_of`: the sides whose kept logits come back; `threads`: the CPU threads each worker (each rank of a
    layout group) was given;
    `device_clock`: use the workers' device-event times (CUDA), cross-checked, rather than the outside clock;
    `hold`: other workers kept stopped throughout."""
    workers = list({id(s.worker): s.worker for s in sides}.values())
    n, steps = len(sides), script.steps
    inside = np.zeros((n, len(steps)))
    outside = np.zeros((n, len(steps)))
    feats: list[list[torch.Tensor]] = [[] for _ in sides]
    argmax: list[list[torch.Tensor]] = [[] for _ in sides]
    kept: list[list[torch.Tensor]] = [[] for _ in sides]
    pending: list[torch.Tensor | None] = [None] * n  # each side's last step's next tokens, scored with its next request
    turns_s = {id(w): 0.0 for w in workers}
    used_graph = False
    rng = random.Random(seed)
    running: Supervisor | None = None

    setup = set(script.setup)
    # Each worker's processes, listed once: a process a challenger starts later is not stopped with it, but its
    # CPU time is charged to the worker (reaped or not, `cpu_seconds`), so it is refused rather than missed.
    pids = {id(w): w.processes() for w in (*workers, *hold)}

    def turn(c: int, req: p.StepRequest) -> tuple[p.StepReply, float]:
        """The reply and the outside seconds from sending `req` to its reply (the worker woken before)."""
        nonlocal running
        worker = sides[c].worker
        # Every turn starts from a stopped worker, even the one that just ran (the incumbent and its twin share one
        # on a GPU): a side that skipped the wake-up others pay would be timed on a different footing.
        if running is not None:
            _stop(pids[id(running)])
        _signal(pids[id(worker)], signal.SIGCONT)
        running = worker
        return call(c, req)

    def call(c: int, req: p.StepRequest) -> tuple[p.StepReply, float]:
        worker = sides[c].worker
        t0 = _clock()
        reply = worker.call(req, timeout_s)
        seconds = _clock() - t0
        turns_s[id(worker)] += seconds
        if reply.status != "ok":
            raise _Failed(p.TrajectoryReply(status=reply.status, error=reply.error, violations=reply.violations))
        if reply.scored is not None:  # the previous step's log p(next), into its rows' fingerprint column
            last = feats[c][-1]
            last[:, -2] = reply.scored
        return reply, seconds

    def request(c: int, step: p.ScriptStep) -> p.StepRequest:
        """Side `c`'s request for `step`: its inputs, without the next tokens (sent with the following request)."""
        return p.StepRequest(sides[c].candidate_id, replace(step, next_tokens=None), score_next=pending[c], seed=seed,
                             num_projections=num_projections, return_logits=step.keep_logits and c in logits_of)

    def record(c: int, s: int, reply: p.StepReply, seconds: float, step: p.ScriptStep) -> None:
        nonlocal used_graph
        outside[c, s], inside[c, s] = seconds, reply.seconds
        used_graph |= reply.used_graph
        assert reply.fingerprint is not None and reply.tokens is not None
        feats[c].append(reply.fingerprint.clone())
        argmax[c].append(reply.tokens)
        if reply.logits is not None:
            kept[c].append(reply.logits)
        pending[c] = step.next_tokens

    cpu0 = {id(w): w.cpu_seconds() for w in workers}
    try:
        for w in (*workers, *hold):
            _stop(pids[id(w)])
        last: int | None = None
        for s, step in enumerate(steps):
            if s in setup:  # nothing timed: every worker runs its sides' step at once, then all stop again
                for w in workers:
                    _signal(pids[id(w)], signal.SIGCONT)
                by_worker = [[c for c in range(n) if sides[c].worker is w] for w in workers]
                with ThreadPoolExecutor(len(workers)) as pool:
                    done = list(pool.map(lambda cs, st=step: [(c, call(c, request(c, st))) for c in cs], by_worker))
                for w in workers:
                    _stop(pids[id(w)])
                running = None
                for c, (reply, seconds) in (item for group in done for item in group):
                    record(c, s, reply, seconds, step)
                continue
            for c in _order(rng, n, last):
                last = c
                reply, seconds = turn(c, request(c, step))
                record(c, s, reply, seconds, step)
        for c in range(n):  # the last step's next tokens, and a collection outside every timed run
            turn(c, p.StepRequest(sides[c].candidate_id, None, score_next=pending[c], collect=True))
    except _Failed as f:
        return f.reply
    finally:
        for w in (*workers, *hold):
            w.signal_all(signal.SIGCONT)
    for w in workers:
        used = w.cpu_seconds() - cpu0[id(w)]
        given = max(threads, 1) * group_size(w.config)  # a layout group: each rank its threads
        allowed = given * turns_s[id(w)] + CPU_SLACK_S
        if used > allowed:
            who = "a trusted worker" if any(s.trusted and s.worker is w for s in sides) else "the challenger's worker"
            raise Refused(f"{who} used {used:.2f} CPU seconds during turns of {turns_s[id(w)]:.2f} s at "
                          f"{given} thread(s): work on threads or processes it was not given")
    times = _cross_checked(inside, outside, sides) if device_clock else outside
    logits = torch.stack([torch.cat(kept[c]) for c in logits_of]) if logits_of and kept[logits_of[0]] else None
    return p.TrajectoryReply(times_s=torch.from_numpy(times), fingerprints=torch.stack([torch.cat(f) for f in feats]),
                             tokens=torch.stack([torch.cat(a) for a in argmax]), logits=logits, used_graph=used_graph)


def _cross_checked(inside: np.ndarray, outside: np.ndarray, sides: Sequence[Side]) -> np.ndarray:
    """Each run's worker-reported time, but never less than its outside time minus the trusted sides' median
    overhead: a worker whose clock was tampered with is timed by the evaluator's."""
    trusted = [c for c, s in enumerate(sides) if s.trusted] or list(range(len(sides)))
    overhead = float(np.median(outside[trusted] - inside[trusted]))
    return np.maximum(inside, outside - overhead)


class _Failed(Exception):
    def __init__(self, reply: p.TrajectoryReply) -> None:
        super().__init__(reply.error)
        self.reply = reply
