"""Configuration of the serving worker (scheduler and canary) and of the front end.

Plain frozen dataclasses with defaults; `to_dict`/`from_dict` carry them across the process
boundary as JSON inside the worker's config file.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from athanor.engine.config import EngineConfig, SandboxConfig


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous batching inside the serving worker."""

    max_num_batched_tokens: int = 256
    """Token budget of one step: decode rows (one token each) first, then prefill chunks fill the rest.
    A long prompt is prefilled over several steps, interleaved with the decode steps of the others."""
    max_queue: int = 256
    """Requests waiting for a slot; beyond this a submit is refused (the HTTP side answers 429)."""
    idle_poll_ms: int = 50
    """How long the loop blocks on its socket when there is nothing to run."""


@dataclass(frozen=True)
class CanaryConfig:
    """A deploy: shadow (teacher-forced logits compared with the incumbent's), then live share, then full."""

    shadow_share: float = 1.0
    """Share of new sequences mirrored onto the challenger during the shadow phase."""
    shadow_min_sequences: int = 3
    """Mirrored sequences that must finish before the shadow phase can pass."""
    shadow_min_rows: int = 24
    """Compared logit rows (prefill chunks and decode steps) needed before the shadow phase can pass."""
    probe_after_idle_s: float = 0.5
    """With no live traffic for this long, the worker mirrors probe sequences of its own (real text)."""
    probe_tokens: int = 12
    """Tokens each probe sequence generates."""
    max_mean_kl: float = 0.01
    """Mean KL(incumbent || challenger) of the compared next-token distributions above which the candidate is
    rolled back (the evaluator's default quality budget). Two correct candidates in one dtype differ by
    rounding only (~1e-6 in fp32, ~1e-3 in bf16)."""
    max_row_kl: float = 0.5
    """KL of any single compared row above which the candidate is rolled back at once (a gross error)."""
    min_top1_agreement: float = 0.9
    """Share of compared rows whose argmax must agree (near ties may flip between correct candidates)."""
    max_step_time_ratio: float = 2.0
    """Challenger step time / incumbent step time on identical batches above which it is a latency regression."""
    min_timed_steps: int = 8
    """Paired steps needed before the latency check judges."""
    live_share: float = 0.25
    """Share of new sequences the challenger serves in the live phase."""
    live_min_requests: int = 2
    """Requests the challenger must finish in the live phase (without an error) before it serves all."""
    live_max_s: float = 5.0
    """With too little traffic, the live phase passes after this long without an error."""
    timeout_s: float = 120.0
    """A deploy that has not finished after this long is rolled back."""


@dataclass(frozen=True)
class WorkerConfig:
    """Everything the serving worker process needs (written as JSON, read before torch loads)."""

    engine: EngineConfig
    socket_path: str
    """The serving socket (unix path) the front end connects to."""
    candidate_dir: str = ""
    """The candidate to serve from the start (a directory with candidate.py and manifest.json); empty: baseline."""
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    canary: CanaryConfig = field(default_factory=CanaryConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> WorkerConfig:
        eng = dict(raw["engine"])
        eng["sandbox"] = SandboxConfig(**eng.get("sandbox", {}))
        eng["buckets"] = tuple(eng.get("buckets", ()))
        return cls(engine=EngineConfig(**eng), socket_path=raw["socket_path"],
                   candidate_dir=raw.get("candidate_dir", ""),
                   scheduler=SchedulerConfig(**raw.get("scheduler", {})),
                   canary=CanaryConfig(**raw.get("canary", {})))
