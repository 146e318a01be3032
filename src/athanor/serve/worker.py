"""The serving worker: `python -m athanor.serve.worker CONFIG.json`.

The engine worker's boot (sandbox first, then the model loaded once into an `Engine` with its
resident candidates), then the step loop of continuous batching instead of the engine's one-RPC-
at-a-time loop (docs/architecture.md: the step loop runs inside the engine process). Each turn drains the
socket (submits, aborts, deploys, status queries, each signed with the key the front end passed on
stdin; any other is dropped unread), runs one step, and sends each front end one
`StepReport` with every token that step produced for its requests.

A deploy builds the challenger beside the incumbent (`Engine.swap(keep_incumbent=True)`), runs the
`Canary`, and finally drops whichever candidate lost once no sequence holds a slot of it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from athanor.engine import group
from athanor.engine.auth import REPORT, read_key, verify
from athanor.serve import messages as m
from athanor.serve.config import WorkerConfig

if TYPE_CHECKING:
    import zmq

    from athanor.engine.core import Engine
    from athanor.serve.canary import Canary
    from athanor.serve.sequence import Sequence

log = logging.getLogger(__name__)

MAX_PROBES = 2
"""Probe sequences in flight at once during an idle shadow phase."""


class ServingLoop:
    def __init__(self, config: WorkerConfig, engine: Engine, sock: zmq.Socket, key: bytes) -> None:
        from athanor.serve.executor import Executor
        from athanor.serve.scheduler import Scheduler

        self.config = config
        self.engine = engine
        self.sock = sock
        self.key = key
        """The front end's request key (`athanor.engine.auth`): a message whose MAC fails is dropped unread."""
        self.dropped = 0
        ec = config.engine
        self.scheduler = Scheduler(config.scheduler, ec.max_seqs, ec.max_seq_len, ec.kv_pages, ec.page_size)
        self._preemptions_reported = 0
        self.executor = Executor(engine, self.scheduler)
        self._unreported: tuple[int, int, list[Sequence], float] | None = None
        """The last step's report, not sent yet (see `_flush_report`)."""
        assert engine.active is not None
        self.incumbent: str = engine.active
        self.scheduler.add_candidate(self.incumbent)
        self.canary: Canary | None = None
        self.deploy_owner = b""
        self.retiring: str | None = None
        """A candidate that lost (or was replaced) and is dropped once no sequence holds its slots."""
        self.owner: dict[str, bytes] = {}
        self.front_end = b""
        """The front end that submitted last: it gets the reports of steps whose tokens nobody owns."""
        self.probes: list[list[int]] = []
        self.last_live = time.monotonic()
        self._rng = random.Random(0)
        self.stopping = False

    # -- messages ---------------------------------------------------------------------------------
    def send(self, ident: bytes, message: object) -> None:
        self.sock.send_multipart([ident, m.encode(message)])

    def drain(self, timeout_ms: int) -> None:
        import zmq

        if not self.sock.poll(timeout_ms):
            return
        while True:
            try:
                ident, *signed = self.sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            body = verify(self.key, signed)
            if body is None or len(body) != 1:  # not from a holder of the key: never decoded
                self.dropped += 1
                if self.dropped <= 10 or self.dropped % 1000 == 0:
                    log.warning("dropped a message without a valid MAC (%d so far)", self.dropped)
                continue
            try:
                msg = m.decode(body[0])
            except m.MessageError as e:
                log.warning("dropped a malformed message: %s", e)
                continue
            self.handle(ident, msg)

    def handle(self, ident: bytes, msg: object) -> None:
        if isinstance(msg, m.Submit):
            why = self.scheduler.check(msg)
            if why:
                self.send(ident, m.Rejected(msg.request_id, why))
            elif self.scheduler.submit(msg) is None:
                self.send(ident, m.Rejected(msg.request_id, "the server is at capacity: retry later", "queue_full"))
            else:
                self.owner[msg.request_id] = ident
                self.front_end = ident
                self.last_live = time.monotonic()
        elif isinstance(msg, m.Abort):
            self.scheduler.abort(msg.request_id)
        elif isinstance(msg, m.Deploy):
            self.deploy(ident, msg)
        elif isinstance(msg, m.StatusQuery):
            self.send(ident, self.status())
        elif isinstance(msg, m.Shutdown):
            self.stopping = True

    def status(self) -> m.Status:
        ec = self.config.engine
        return m.Status(self.incumbent, tuple(self.engine.residents), len(self.scheduler.waiting),
                        len(self.scheduler.running), os.getpid(), self.canary.state() if self.canary else None,
                        ec.kv_pages * ec.page_size)

    # -- deploys ----------------------------------------------------------------------------------
    def _report_deploy(self) -> None:
        if self.canary is not None and self.deploy_owner:
            self.send(self.deploy_owner, self.canary.state())

    def deploy(self, ident: bytes, msg: m.Deploy) -> None:
        from athanor.engine import protocol as p
        from athanor.engine.candidate import Candidate, CandidateManifest
        from athanor.serve.canary import Canary

        cid = msg.content_hash[:16]

        def refuse(reason: str, phase: str = "failed") -> None:
            now = time.time()
            self.send(ident, m.DeploymentState(msg.deploy_id, cid, self.incumbent, phase, reason, {}, now, now))

        if self.config.engine.max_resident < 2:
            return refuse("this server keeps one resident candidate (--no-canary): no room for a challenger")
        if self.canary is not None and not self.canary.finished:
            return refuse(f"deploy {self.canary.deploy_id} of {self.canary.candidate_id} is still in its canary")
        self._retire()
        if self.retiring is not None:
            return refuse(f"the previous candidate {self.retiring} still serves sequences; retry in a moment")
        if cid == self.incumbent:
            return refuse(f"{cid} is already serving", phase="deployed")
        candidate = Candidate(msg.source, CandidateManifest(msg.content_hash, msg.parent, msg.author, msg.description))
        self.deploy_owner = ident
        self.probes = [list(q) for q in msg.probes]
        canary = Canary(self.config.canary, msg.deploy_id, cid, self.incumbent, seed=msg.deploy_id)
        canary.phase = "building"
        self.canary = canary
        self._report_deploy()
        self.executor.settle()
        reply = group.call(self.engine, p.SwapRequest(candidate, keep_incumbent=True))
        group.call(self.engine, p.ActivateRequest(self.incumbent))  # the incumbent serves until the canary passes
        if reply.status != "ok":
            canary.fail(f"the candidate did not build ({reply.status}): {reply.error.strip()[-2000:]}")
        else:
            self.scheduler.add_candidate(cid)
            canary.phase = "shadow"
            log.info("deploy %d: %s built in %.2fs; shadow phase", msg.deploy_id, cid, reply.total_s)
        self._report_deploy()

    def _after_decision(self) -> None:
        from athanor.engine import protocol as p

        canary = self.canary
        assert canary is not None
        if canary.phase in ("deployed", "rolled_back"):
            for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
                self.scheduler.drop_twin(seq)
        if canary.phase == "deployed":
            group.call(self.engine, p.ActivateRequest(canary.candidate_id))
            self.retiring, self.incumbent = self.incumbent, canary.candidate_id
        elif canary.phase == "rolled_back":
            self.retiring = canary.candidate_id
            log.warning("deploy %d of %s rolled back: %s", canary.deploy_id, canary.candidate_id, canary.reason)
        self._report_deploy()

    def _retire(self) -> None:
        from athanor.engine import protocol as p

        if self.retiring is None or self.scheduler.sequences_on(self.retiring):
            return
        if self.retiring in self.engine.residents:
            self.executor.settle()
            group.call(self.engine, p.DropRequest(self.retiring))
        self.scheduler.remove_candidate(self.retiring)
        self.retiring = None

    # -- steps ------------------------------------------------------------------------------------
    def _route(self, seq: Sequence) -> str:
        return self.canary.route(seq) if self.canary is not None and not self.canary.finished else self.incumbent

    def _want_twin(self, seq: Sequence) -> str:
        return self.canary.want_twin(seq) if self.canary is not None and not self.canary.finished else ""

    def _maybe_probe(self) -> None:
        canary = self.canary
        live = [s for s in (*self.scheduler.running, *self.scheduler.waiting) if not s.is_probe]
        if live:
            self.last_live = time.monotonic()
        if canary is None or not canary.wants_probe(time.monotonic() - self.last_live):
            return
        if sum(s.is_probe for s in self.scheduler.running) >= MAX_PROBES or self.scheduler.waiting:
            return
        ec = self.config.engine
        room = ec.max_seq_len - self.config.canary.probe_tokens - 1
        vocab = self.engine.model.spec.vocab_size
        prompt = (self._rng.choice(self.probes) if self.probes
                  else [self._rng.randrange(vocab) for _ in range(16)])[:room]
        self.scheduler.submit(m.Submit(self.scheduler.probe_id(), tuple(prompt), self.config.canary.probe_tokens),
                              is_probe=True)

    def step(self) -> bool:
        """One step; False when there was nothing to run."""
        self._maybe_probe()
        plan = self.scheduler.schedule(self._route, self._want_twin)
        phase = self.canary.phase if self.canary is not None else ""
        t = time.perf_counter()
        if plan:
            # Neither the report nor chained steps (the next queued before this one's tokens are read) during
            # a canary: its step times compare the incumbent with the challenger on identical batches.
            in_canary = self.canary is not None and not self.canary.finished
            failures = self.executor.run(plan, self.canary, while_running=None if in_canary else self._flush_report,
                                         chain=not in_canary)
            for failure in failures:
                self._failed(failure, plan)
        self._flush_report()  # when the step ran nothing (or failed before the device ran it)
        finished = self.scheduler.finished
        self.scheduler.finished = []
        if self.canary is not None and not self.canary.finished:
            for seq in finished:
                self.canary.sequence_finished(seq, had_twin=seq.twin_candidate == self.canary.candidate_id)
            self.canary.decide()
        if self.canary is not None and self.canary.phase != phase:
            self._after_decision()
        self._retire()
        if plan or finished:
            # Sent while the device runs the next step (see `_flush_report`); at once when there is none.
            self._unreported = (plan.num_decode_rows, plan.num_prefill_tokens, finished, time.perf_counter() - t)
            if self.scheduler.is_idle:
                self._flush_report()
        return bool(plan)

    def _flush_report(self) -> None:
        """Send the last step's tokens to their front ends. Called while the device runs the next step,
        so encoding and sending them does not add to every token's time."""
        if self._unreported is not None:
            pending, self._unreported = self._unreported, None
            self._report(*pending)

    def _failed(self, failure: Any, plan: Any) -> None:
        canary = self.canary
        in_canary = canary is not None and not canary.finished
        if failure.shadow:  # only the challenger's twin failed: the requests themselves are fine
            if canary is not None and in_canary:
                canary.error("shadow run", failure.error)
            return
        seqs = [c.seq for part in (plan.decode, plan.prefill) for c in part.get(failure.candidate_id, [])]
        if canary is not None and in_canary and failure.candidate_id == canary.candidate_id:
            canary.error("live phase", failure.error)
            for seq in seqs:  # their requests continue on the incumbent, recomputed from their tokens
                if seq in self.scheduler.running:
                    self.scheduler.migrate(seq, self.incumbent)
            return
        log.error("step failed on %s: %s", failure.candidate_id, failure.error)
        for seq in seqs:
            if seq in self.scheduler.running:
                self.scheduler.finish(seq, "error", failure.error.strip().splitlines()[-1])

    def _report(self, num_decode_rows: int, num_prefill_tokens: int, finished: list[Sequence], seconds: float) -> None:
        by_owner: dict[bytes, list[m.TokenOutput]] = defaultdict(list)
        for seq in (*self.scheduler.running, *finished):
            if seq.is_probe:
                continue
            done = seq.num_emitted
            new = seq.tokens[seq.num_prompt + done:]
            if not new and seq.finish_reason is None:
                continue
            seq.num_emitted += len(new)
            ident = self.owner.get(seq.request_id)
            if ident is None:
                continue
            k = max(0, seq.request.logprobs)  # top tokens per generated token
            by_owner[ident].append(m.TokenOutput(
                seq.request_id, tuple(new), seq.finish_reason, seq.error, seq.candidate_id,
                tuple(seq.logprobs[done:seq.num_emitted]), tuple(seq.top_ids[k * done:k * seq.num_emitted]),
                tuple(seq.top_logprobs[k * done:k * seq.num_emitted])))
            if seq.finish_reason is not None:
                self.owner.pop(seq.request_id, None)
        if not by_owner and self.front_end:
            # A step that emitted nothing (a long prompt's middle chunk) still counts in the metrics.
            by_owner[self.front_end] = []
        for ident, outputs in by_owner.items():
            self.send(ident, m.StepReport(tuple(outputs), num_decode_rows, num_prefill_tokens,
                                          len(self.scheduler.waiting), len(self.scheduler.running), seconds,
                                          self._take_preemptions()))

    def _take_preemptions(self) -> int:
        """Preemptions since the last report that carried them (each report goes to one front end's owner)."""
        n = self.scheduler.num_preemptions - self._preemptions_reported
        self._preemptions_reported = self.scheduler.num_preemptions
        return n

    def run(self) -> None:
        idle_ms = self.config.scheduler.idle_poll_ms
        while not self.stopping:
            busy = not self.scheduler.is_idle or (self.canary is not None and not self.canary.finished)
            self.drain(0 if busy else idle_ms)
            if not self.stopping and not self.step() and busy:
                time.sleep(0.002)  # waiting for probes or a decision: do not spin a core


def run_worker(config: WorkerConfig, key: bytes) -> int:
    from athanor.engine.candidate import baseline_candidate
    from athanor.engine.candidate_dir import load_candidate_dir
    from athanor.engine.worker import boot, exit_with_parent
    from athanor.serve.pool_size import build_with_pool

    engine = boot(config.engine, REPORT)
    import zmq

    incumbent = load_candidate_dir(config.candidate_dir) if config.candidate_dir else baseline_candidate()
    what = f"--candidate {config.candidate_dir}" if config.candidate_dir else "the reference forward"
    if not build_with_pool(engine, incumbent, what):
        return 1
    config = dataclasses.replace(config, engine=engine.config)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    path = Path(config.socket_path)
    path.unlink(missing_ok=True)
    sock.bind(f"ipc://{path}")
    exit_with_parent()
    cfg, state = config.engine, sum(r.ctx.allocated_bytes for r in engine.residents.values())
    log.info("serving %s on %s; KV pool %d tokens (%d pages of %d) per candidate, up to %d sequences of %d tokens "
             "(%.2f GiB of candidate state)", engine.active, path, cfg.kv_pages * cfg.page_size, cfg.kv_pages,
             cfg.page_size, cfg.max_seqs, cfg.max_seq_len, state / 2**30)
    ServingLoop(config, engine, sock, key).run()
    engine.group.publish(group.Stop())
    sock.close()
    ctx.term()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m athanor.serve.worker CONFIG.json\n")
        return 2
    key = read_key()  # first: nothing else may read the pipe
    logging.basicConfig(level=logging.INFO, format="%(asctime)s serve-worker %(levelname)s %(name)s: %(message)s")
    config = WorkerConfig.from_dict(json.loads(Path(args[0]).read_text()))
    return run_worker(config, key)


if __name__ == "__main__":
    sys.exit(main())
