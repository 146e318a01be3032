"""The canary of a deploy, inside the serving worker: shadow, then a live share, then full — or rollback.

Phases (`DeploymentState.phase`):

- ``shadow``: new sequences on the incumbent get a *twin* on the challenger that is fed the same tokens
  (teacher forcing: the incumbent's sampled tokens, never the challenger's), so every prefill chunk
  and decode step yields a pair of next-token distributions for the same context. Sampled text differs
  between two correct bf16 candidates; their distributions do not, so those are compared (KL and
  argmax agreement), and the paired step times of identical batches give the latency check. With no
  live traffic the worker mirrors probe sequences of its own.
- ``live``: a share of new sequences is prefilled on the challenger and served from it.
- ``deployed``: the challenger serves every new sequence; the incumbent finishes what it holds, then is dropped.
- ``rolled_back`` (errors, logit mismatch, latency regression, timeout) or ``failed`` (the build failed).

The decisions are here, pure Python; `executor` measures and `worker` swaps and drops.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field

from athanor.serve.config import CanaryConfig
from athanor.serve.messages import DeploymentState
from athanor.serve.sequence import Sequence


@dataclass
class CanaryFigures:
    shadow_rows: int = 0
    shadow_sequences: int = 0
    sum_kl: float = 0.0
    max_kl: float = 0.0
    top1_agree: int = 0
    step_ratios: list[float] = field(default_factory=list)
    live_requests: int = 0
    errors: int = 0

    def as_dict(self) -> dict[str, float]:
        rows = max(self.shadow_rows, 1)
        return {
            "shadow_rows": self.shadow_rows,
            "shadow_sequences": self.shadow_sequences,
            "mean_kl": self.sum_kl / rows,
            "max_kl": self.max_kl,
            "top1_agreement": self.top1_agree / rows if self.shadow_rows else 0.0,
            "timed_steps": len(self.step_ratios),
            "step_time_ratio": statistics.median(self.step_ratios) if self.step_ratios else 0.0,
            "live_requests": self.live_requests,
            "errors": self.errors,
        }


class Canary:
    def __init__(self, config: CanaryConfig, deploy_id: int, candidate_id: str, incumbent_id: str,
                 seed: int = 0) -> None:
        self.config = config
        self.deploy_id = deploy_id
        self.candidate_id = candidate_id
        self.incumbent_id = incumbent_id
        self.phase = "shadow"
        self.reason = ""
        self.figures = CanaryFigures()
        self.started_at = time.time()
        self.updated_at = self.started_at
        self._phase_started = time.monotonic()
        self._began = time.monotonic()
        self._rng = random.Random(seed)

    @property
    def finished(self) -> bool:
        return self.phase in ("deployed", "rolled_back", "failed")

    def state(self) -> DeploymentState:
        return DeploymentState(self.deploy_id, self.candidate_id, self.incumbent_id, self.phase, self.reason,
                               self.figures.as_dict(), self.started_at, self.updated_at)

    # -- routing ----------------------------------------------------------------------------------
    def route(self, seq: Sequence) -> str:
        """The candidate a new sequence is prefilled on."""
        if self.phase == "deployed":
            return self.candidate_id
        if self.phase == "live" and not seq.is_probe and self._rng.random() < self.config.live_share:
            return self.candidate_id
        return self.incumbent_id

    def want_twin(self, seq: Sequence) -> str:
        """The candidate to mirror a new sequence on ("" for none)."""
        if self.phase == "shadow" and seq.candidate_id == self.incumbent_id and (
                seq.is_probe or self._rng.random() < self.config.shadow_share):
            return self.candidate_id
        return ""

    # -- evidence ---------------------------------------------------------------------------------
    def observe_rows(self, kls: list[float], agree: list[bool]) -> None:
        f = self.figures
        f.shadow_rows += len(kls)
        f.sum_kl += sum(kls)
        f.max_kl = max([f.max_kl, *kls])
        f.top1_agree += sum(agree)
        if f.max_kl > self.config.max_row_kl:
            self.rollback(f"logit mismatch: a next-token distribution differs from the incumbent's by KL "
                          f"{f.max_kl:.3g} (limit {self.config.max_row_kl:g})")

    def observe_step_times(self, incumbent_s: float, challenger_s: float) -> None:
        if incumbent_s > 0:
            self.figures.step_ratios.append(challenger_s / incumbent_s)

    def sequence_finished(self, seq: Sequence, had_twin: bool) -> None:
        if had_twin:
            self.figures.shadow_sequences += 1
        if self.phase == "live" and seq.candidate_id == self.candidate_id and seq.finish_reason != "error":
            self.figures.live_requests += 1

    def error(self, where: str, text: str) -> None:
        self.figures.errors += 1
        first = text.strip().splitlines()[-1] if text.strip() else "error"
        self.rollback(f"the candidate raised in the {where}: {first}")

    # -- decisions --------------------------------------------------------------------------------
    def rollback(self, reason: str) -> None:
        if not self.finished:
            self._set("rolled_back", reason)

    def fail(self, reason: str) -> None:
        self._set("failed", reason)

    def _set(self, phase: str, reason: str = "") -> None:
        self.phase, self.reason = phase, reason
        self.updated_at = time.time()
        self._phase_started = time.monotonic()

    def decide(self) -> bool:
        """Advance or roll back on the evidence so far; True when the phase changed."""
        if self.finished:
            return False
        before = self.phase
        cfg, f = self.config, self.figures
        if time.monotonic() - self._began > cfg.timeout_s:
            self.rollback(f"the canary did not finish within {cfg.timeout_s:g}s ({self.phase} phase)")
        elif self.phase == "shadow":
            figs = f.as_dict()
            if f.shadow_rows >= cfg.shadow_min_rows and figs["mean_kl"] > cfg.max_mean_kl:
                self.rollback(f"logit mismatch: mean KL {figs['mean_kl']:.3g} over {f.shadow_rows} rows "
                              f"(limit {cfg.max_mean_kl:g})")
            elif f.shadow_rows >= cfg.shadow_min_rows and figs["top1_agreement"] < cfg.min_top1_agreement:
                self.rollback(f"logit mismatch: the argmax agrees on {100 * figs['top1_agreement']:.0f}% of "
                              f"{f.shadow_rows} rows (needs {100 * cfg.min_top1_agreement:.0f}%)")
            elif len(f.step_ratios) >= cfg.min_timed_steps and figs["step_time_ratio"] > cfg.max_step_time_ratio:
                self.rollback(f"latency regression: steps take {figs['step_time_ratio']:.2f}x the incumbent's "
                              f"(limit {cfg.max_step_time_ratio:g}x)")
            elif (f.shadow_sequences >= cfg.shadow_min_sequences and f.shadow_rows >= cfg.shadow_min_rows
                  and len(f.step_ratios) >= cfg.min_timed_steps):
                self._set("live")
        elif self.phase == "live":
            waited = time.monotonic() - self._phase_started
            if f.live_requests >= cfg.live_min_requests or waited >= cfg.live_max_s:
                self._set("deployed", f"shadow: mean KL {f.as_dict()['mean_kl']:.2g} over {f.shadow_rows} rows, "
                                      f"steps {f.as_dict()['step_time_ratio']:.2f}x; live: {f.live_requests} requests")
        return self.phase != before

    def wants_probe(self, idle_s: float) -> bool:
        return self.phase == "shadow" and idle_s >= self.config.probe_after_idle_s
