"""How one evaluation moves through the cascade's stages (`athanor.evaluate.verdict.STAGES`): `Progress`, its
bookkeeping, and `Rejected`, the control flow of a stage that fails (the evaluator turns it into a verdict)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from athanor.evaluate.verdict import TierResult


class Rejected(Exception):
    """A stage failed: carries the stage and the one-line reason (internal control flow)."""

    def __init__(self, stage: str, reason: str, status: str = "rejected") -> None:
        super().__init__(reason)
        self.stage, self.reason, self.status = stage, reason, status


@dataclass
class Progress:
    """Mutable bookkeeping of one evaluation: the stage it is in, the seconds each stage before it took, the tiers
    done and the candidate's compile seconds."""

    stages: list[tuple[str, float]] = field(default_factory=list)
    tiers: list[TierResult] = field(default_factory=list)
    compile_s: float = 0.0
    stage: str = "static"
    t: float = field(default_factory=time.perf_counter)

    def enter(self, stage: str) -> None:
        now = time.perf_counter()
        self.stages.append((self.stage, now - self.t))
        self.stage, self.t = stage, now
