"""`TierEngines`: the engine workers of one tier: the incumbent's, its twin's, the challenger's, the reference's.

Each timed side has a worker of its own, so nothing the challenger runs can reach, patch or slow the residents it
is timed against. The twin, a second instance of the incumbent, is the A/A floor: two runs of one resident would
share what the last run left warm (its buffers, its caches, its weights in the CPU's caches), an advantage the
challenger never gets, so the floor would miss a bias against every challenger; three workers alike keep the
sides exchangeable. They are interleaved step by step from the evaluator's process
(`athanor.evaluate.interleave`). The reference engine runs
only the baseline forward, in a worker that never imports candidate code: a candidate can neither patch it nor
read its outputs, and its weights digest is the one the other workers' must keep.

A challenger that declares a parallel layout (`LAYOUT = "tp2"`) runs in a challenger worker started in that
layout, a group of one process per rank, kept for the tier's life like the others. Its step times are counted in
device-seconds (wall time times its ranks), the objective's unit, against the one-device incumbent.
"""

from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import ThreadPoolExecutor

from athanor.engine import protocol as p
from athanor.engine.candidate import Candidate, baseline_candidate
from athanor.engine.config import EngineConfig, SandboxConfig, decode_buckets
from athanor.engine.group import check_layout, group_size
from athanor.engine.supervisor import Supervisor, Timeouts
from athanor.errors import ConfigError, EngineDied
from athanor.evaluate.config import EvaluateConfig
from athanor.evaluate.interleave import Refused, Side, run_interleaved
from athanor.evaluate.lock import timing_threads
from athanor.evaluate.scripts import Script
from athanor.seams import declared_layout, layout_name

log = logging.getLogger(__name__)


def engine_config(cfg: EvaluateConfig, num_layers: int) -> EngineConfig:
    buckets = decode_buckets(cfg.max_seqs)
    return EngineConfig(model=cfg.model, device=cfg.device, dtype=cfg.dtype, num_layers=num_layers,
                        max_seqs=cfg.max_seqs, max_seq_len=cfg.max_seq_len, buckets=buckets, max_resident=3,
                        sandbox=SandboxConfig(enabled=cfg.sandbox), cpu_threads=timing_threads(cfg.device))


class TierEngines:
    def __init__(self, cfg: EvaluateConfig, num_layers: int) -> None:
        self.num_layers = num_layers
        t = cfg.timeouts
        timeouts = Timeouts(start_s=t.start_s, swap_s=t.swap_s, run_s=max(t.check_s, t.timing_s))
        config = engine_config(cfg, num_layers)
        self.reference_candidate = baseline_candidate()
        # On a CPU a small model's weights can sit in the caches, so a twin in the incumbent's worker would run on
        # weights the incumbent just left warm, while the challenger never does: each side gets its own worker. On
        # a GPU the weights are far bigger than its L2 and the twin shares the incumbent's worker (one copy fewer).
        apart = not cfg.device.startswith("cuda")
        self.incumbent = Supervisor(dataclasses.replace(config, max_resident=1 if apart else 2), timeouts)
        self.twin = Supervisor(dataclasses.replace(config, max_resident=1), timeouts) if apart else self.incumbent
        self.challenger = Supervisor(config, timeouts)
        """The challenger, beside the baseline it starts with (so a respawn never rebuilds a challenger)."""
        self.challengers = {layout_name({}): self.challenger}
        """A challenger worker per layout a challenger declared, by the layout's name, each started when first
        needed; `challenger` is the one the last loaded challenger runs in."""
        self._config, self._timeouts = config, timeouts
        self.reference = Supervisor(dataclasses.replace(config, max_resident=1, trusted=True), timeouts)
        """Trusted: it never imports candidate code, so it alone may write the shared compile cache."""
        self.threads = config.cpu_threads + (1 if cfg.device.startswith("cuda") else 0)
        """CPU threads a worker may keep busy during its turn: the intra-op threads; on CUDA one more for the runtime's
        (the driver's and the RPC socket's I/O threads)."""
        self.device_clock = cfg.device.startswith("cuda")
        self._digests: dict[str, str] = {}
        """The trusted reference worker's weights digest per layout name (`integrity.shards_digest`)."""
        self.bandwidth = 0.0

    def start(self) -> None:
        """Start the workers side by side (each is mostly its own imports and model load)."""
        with ThreadPoolExecutor(len(self.workers())) as pool:
            for future in [pool.submit(worker.start) for worker in self.workers()]:
                future.result()
        probe = self.reference.call(p.ProbeRequest(bandwidth=True))
        self._digests[layout_name({})] = probe.weights_digest
        self.bandwidth = probe.bandwidth_bytes_per_s

    @property
    def reference_digest(self) -> str:
        """The weights digest the loaded challenger's worker must keep: the trusted reference's, of the shards its
        layout holds where it runs one."""
        return self._digests[layout_name(self.challenger.config.layout)]

    def load(self, incumbent: Candidate, candidate: Candidate, timeout_s: float) -> p.SwapReply:
        """Make `incumbent` the engine's incumbent, with its twin, and build `candidate` in its own worker (one
        started in the layout it declares)."""
        self.prepare(incumbent, timeout_s)
        try:
            degrees = declared_layout(candidate.source, f"candidate {candidate.id}") or {}
        except ConfigError as e:
            return p.SwapReply(status="invalid", error=str(e), candidate_id=candidate.id)
        name = layout_name(degrees)
        if name not in self.challengers:
            worker = Supervisor(dataclasses.replace(self._config, layout=degrees), self._timeouts)
            try:
                check_layout(worker.config)
                worker.start()
            except (ConfigError, EngineDied) as e:
                worker.close()
                return p.SwapReply(status="invalid", error=f"candidate {candidate.id}: its layout {name} cannot "
                                   f"start here: {str(e).splitlines()[0]}", candidate_id=candidate.id)
            self.challengers[name] = worker
            self._digests[name] = self.reference.call(p.ProbeRequest(shards=name)).weights_digest
        self.challenger = self.challengers[name]
        return self.challenger.swap(candidate, keep_incumbent=True, timeout_s=timeout_s)

    @property
    def challenger_devices(self) -> int:
        """Devices the loaded challenger runs on (its layout's ranks), against the incumbent's one: its step times
        count this many times over, in device-seconds (the objective's unit)."""
        return group_size(self.challenger.config)

    def prepare(self, incumbent: Candidate, timeout_s: float) -> None:
        """Make `incumbent` the incumbent worker's resident and its twin the twin worker's (the same on a GPU)."""
        twin = twin_of(incumbent)
        if self.incumbent.incumbent.id != incumbent.id or not self.incumbent.is_alive():
            reply = self.incumbent.swap(incumbent, timeout_s=timeout_s)
            if reply.status != "ok":
                raise IncumbentFailed(f"the incumbent {incumbent.id} does not build: {reply.error}")
        shared = self.twin is self.incumbent
        if (twin.id not in self.twin.stats().resident) if shared else (self.twin.incumbent.id != twin.id
                                                                         or not self.twin.is_alive()):
            reply = self.twin.swap(twin, keep_incumbent=shared, timeout_s=timeout_s)
            if reply.status != "ok":
                raise IncumbentFailed(f"a second instance of the incumbent {incumbent.id} does not build: "
                                      f"{reply.error}")

    def unload(self, candidate: Candidate, tainted: bool) -> None:
        """Drop the challenger; a worker it changed (weights, namespaces, processes left running) is replaced."""
        extra = self.challenger.extra_processes()
        if tainted or extra:
            log.info("candidate %s changed its worker's state%s: respawning it", candidate.id,
                     f" (processes left: {', '.join(extra[:3])})" if extra else "")
            self.challenger.respawn()
            return
        base = self.challenger.incumbent.id
        if candidate.id != base and self.challenger.activate(base).status == "ok":
            self.challenger.drop(candidate.id)

    def workers(self) -> tuple[Supervisor, ...]:
        apart = () if self.twin is self.incumbent else (self.twin,)
        return self.reference, self.incumbent, *apart, *self.challengers.values()

    def side(self, cid: str) -> Side:
        """The worker that holds resident `cid`: the incumbent's, the twin's, else the challenger's."""
        incumbent = self.incumbent.incumbent
        if cid == incumbent.id:
            return Side(cid, self.incumbent, True)
        if cid == twin_of(incumbent).id:
            return Side(cid, self.twin, True)
        return Side(cid, self.challenger, False)

    def run(self, ids: tuple[str, ...], script: Script, seed: int, timeout_s: float,
            logits_of: tuple[str, ...] = (), alone: bool = False) -> p.TrajectoryReply:
        """`script` on the residents `ids`, interleaved step by step; a refusal is a violation reply. `alone`: the
        challenger's worker stays stopped throughout (the incumbent timed by itself), and the trusted reference
        worker takes the challenger's turn after the first side's, running the reference: each side's steps then
        follow as many other workers' as beside a challenger, so what the caches keep between them is the same and
        a slowdown beside the challenger is the challenger's doing (its row is the reply's second)."""
        sides = [self.side(c) for c in ids]
        if alone:
            sides.insert(1, Side(self.reference_candidate.id, self.reference, True))
        # The challenger workers not in this trajectory stay stopped throughout, like the challenger when `alone`.
        timed = {id(s.worker) for s in sides}
        hold = tuple(w for w in self.challengers.values() if id(w) not in timed)
        try:
            return run_interleaved(sides, script, seed, timeout_s, logits_of=[ids.index(c) for c in logits_of],
                                   threads=self.threads, device_clock=self.device_clock, hold=hold)
        except Refused as e:
            return p.TrajectoryReply(status="violation", error=str(e), violations=(str(e),))

    def run_reference(self, script: Script, seed: int, timeout_s: float) -> p.TrajectoryReply:
        req = p.TrajectoryRequest((self.reference_candidate.id,), script.steps, seed=seed)
        reply = self.reference.call(req, timeout_s)
        if reply.status != "ok":
            raise ReferenceFailed(f"the reference engine failed ({reply.status}): {reply.error}")
        return reply

    def probe(self) -> p.ProbeReply:
        """The challenger's worker's integrity figures: the only worker its code runs in (the incumbent's and the
        twin's run the incumbent, probed when it was the challenger, and nothing of this challenger reaches them)."""
        return self.challenger.call(p.ProbeRequest())

    def close(self) -> None:
        with ThreadPoolExecutor(len(self.workers())) as pool:
            list(pool.map(lambda w: w.close(), self.workers()))


def twin_of(incumbent: Candidate) -> Candidate:
    """The incumbent under another id: built as its own resident, timed as the A/A side."""
    return Candidate.from_source(incumbent.source + "\n# athanor: a second instance of the incumbent (A/A)\n",
                                 parent=incumbent.id, description="twin of the incumbent (the A/A floor)")


class IncumbentFailed(Exception):
    """The incumbent itself no longer builds or runs: the evaluator cannot judge (status "error")."""


class ReferenceFailed(Exception):
    """The trusted reference engine failed: the evaluator cannot judge (status "error")."""
