"""`TierEngines`: the two engine workers of one tier, the candidates' and the reference's.

The candidate engine holds the incumbent, a second instance of it (`twin`) and the challenger
side by side (interleaved timing needs them in one process). The twin is the A/A floor: two
runs of one resident would share what the last run left warm (its buffers, its caches), an
advantage the challenger, a different resident, never gets, so the floor would miss a bias
against every challenger. Three residents are exchangeable. The reference engine runs only the
baseline forward, in a worker that never imports candidate code: a candidate can neither patch it
nor read its outputs, and its weights digest is the one the candidate engine's must keep.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from athanor.engine import protocol as p
from athanor.engine.candidate import Candidate, baseline_candidate
from athanor.engine.config import DEFAULT_BUCKETS, EngineConfig, SandboxConfig
from athanor.engine.supervisor import Supervisor, Timeouts
from athanor.evaluate.config import EvaluateConfig
from athanor.evaluate.lock import timing_threads
from athanor.evaluate.scripts import Script

log = logging.getLogger(__name__)


def engine_config(cfg: EvaluateConfig, num_layers: int) -> EngineConfig:
    buckets = tuple(sorted({b for b in DEFAULT_BUCKETS if b < cfg.max_seqs} | {cfg.max_seqs}))
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
        self.candidates = Supervisor(config, timeouts)
        self.reference = Supervisor(dataclasses.replace(config, max_resident=1), timeouts)
        self._reference_digest = ""
        self.bandwidth = 0.0

    def start(self) -> None:
        self.reference.start()
        self.candidates.start()
        probe = self.reference.call(p.ProbeRequest(bandwidth=True))
        self._reference_digest = probe.weights_digest
        self.bandwidth = probe.bandwidth_bytes_per_s

    @property
    def reference_digest(self) -> str:
        return self._reference_digest

    def load(self, incumbent: Candidate, candidate: Candidate, timeout_s: float) -> p.SwapReply:
        """Make `incumbent` the engine's incumbent, with its twin, and build `candidate` beside them."""
        self.prepare(incumbent, timeout_s)
        return self.candidates.swap(candidate, keep_incumbent=True, timeout_s=timeout_s)

    def prepare(self, incumbent: Candidate, timeout_s: float) -> None:
        """Make `incumbent` the engine's incumbent with its twin beside it, and no challenger."""
        twin = twin_of(incumbent)
        if self.candidates.incumbent.id != incumbent.id or not self.candidates.is_alive():
            reply = self.candidates.swap(incumbent, timeout_s=timeout_s)
            if reply.status != "ok":
                raise IncumbentFailed(f"the incumbent {incumbent.id} does not build: {reply.error}")
        resident = self.candidates.stats().resident
        for other in resident:  # a challenger left from an earlier evaluation
            if other not in (incumbent.id, twin.id):
                self.candidates.activate(incumbent.id)
                self.candidates.drop(other)
        if twin.id not in resident:
            reply = self.candidates.swap(twin, keep_incumbent=True, timeout_s=timeout_s)
            if reply.status != "ok":
                raise IncumbentFailed(f"a second instance of the incumbent {incumbent.id} does not build: "
                                      f"{reply.error}")

    def unload(self, incumbent: Candidate, candidate: Candidate, tainted: bool) -> None:
        """Drop the challenger; a worker whose weights or namespaces it changed is replaced."""
        if tainted:
            log.info("candidate %s changed the worker's state: respawning it", candidate.id)
            self.candidates.respawn()
            return
        if self.candidates.activate(incumbent.id).status == "ok":
            self.candidates.drop(candidate.id)

    def run(self, ids: tuple[str, ...], script: Script, seed: int, timeout_s: float,
            logits_of: tuple[str, ...] = ()) -> p.TrajectoryReply:
        return self.candidates.call(p.TrajectoryRequest(ids, script.steps, seed=seed, logits_of=logits_of), timeout_s)

    def run_reference(self, script: Script, seed: int, timeout_s: float) -> p.TrajectoryReply:
        req = p.TrajectoryRequest((self.reference_candidate.id,), script.steps, seed=seed)
        reply = self.reference.call(req, timeout_s)
        if reply.status != "ok":
            raise ReferenceFailed(f"the reference engine failed ({reply.status}): {reply.error}")
        return reply

    def probe(self) -> Any:
        return self.candidates.call(p.ProbeRequest())

    def close(self) -> None:
        self.candidates.close()
        self.reference.close()


def twin_of(incumbent: Candidate) -> Candidate:
    """The incumbent under another id: built as its own resident, timed as the A/A side."""
    return Candidate.from_source(incumbent.source + "\n# athanor: a second instance of the incumbent (A/A)\n",
                                 parent=incumbent.id, description="twin of the incumbent (the A/A floor)")


class IncumbentFailed(Exception):
    """The incumbent itself no longer builds or runs: the evaluator cannot judge (status "error")."""


class ReferenceFailed(Exception):
    """The trusted reference engine failed: the evaluator cannot judge (status "error")."""
