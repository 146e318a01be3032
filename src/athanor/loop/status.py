"""What a compile session says as it goes: its status for a live line (`SessionStatus`), one line per verdict, the
model it compiles in one line, and the flags of its precision mode."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from athanor.evaluate import QualityBudget, Speedup, Verdict
from athanor.evaluate.timing import worth_confirming
from athanor.loop.config import CompileConfig


@dataclass(frozen=True)
class SessionStatus:
    """Where a running session stands, for a status line: `Session` hands one to its `status` hook whenever what
    it does changes (an agent asked to propose, a screen or a confirmation begun, the engines stopped, the report
    written)."""

    budget_s: float
    used_s: float
    """Seconds of the budget used when this was taken, on the session's clock."""
    screened: int
    """Proposals screened on the fast tier so far in this session."""
    confirmed: int
    """Candidates judged on the slow tier (the whole model) so far in this run."""
    doing: str
    """What runs now, e.g. "screening <candidate id> by variant"."""
    best_id: str = ""
    """The candidate with the highest speedup timed so far ("" before any), by its latest tier's figure."""
    best_tier: str = ""
    """The tier that figure is from: "fast" (projected from a few layers) or "slow" (the whole model)."""
    best: Speedup = field(default_factory=Speedup)
    """That figure: the median speedup over the baseline and its 95% interval."""

    def text(self, since_s: float = 0.0) -> str:
        """The status as one line, `since_s` seconds after it was taken (a live line moves the budget's clock on
        between updates)."""
        used = self.used_s + since_s
        # Short enough for a terminal's line: what runs now comes last and names the candidate.
        best = (f"best x{self.best.median:.3f} [{self.best.ci_low:.3f}, {self.best.ci_high:.3f}] {self.best_tier}"
                if self.best_id else "best -")
        return (f"budget {used:.0f} s used, {max(0.0, self.budget_s - used):.0f} s left | screened {self.screened}, "
                f"confirmed {self.confirmed} | {best} | {self.doing}")


StatusHook = Callable[[SessionStatus], None]
"""What a session tells where it stands (`Session(status=...)`, `compile_session(status=...)`)."""


def no_status(status: SessionStatus) -> None:
    """The status hook of a session nobody watches."""


def verdict_line(tier: str, author: str, description: str, v: Verdict, margin: float = 0.01) -> str:
    s = v.speedup
    figure = f"x{s.median:.3f} [{s.ci_low:.3f}, {s.ci_high:.3f}]" if not math.isnan(s.median) else "-"
    verdict = "ACCEPTED" if v.accepted else f"{v.status} at {v.stage}"
    if tier == "fast" and not v.accepted and worth_confirming(v, margin):
        verdict = "to confirm (median over the bar)"
    return f"[{tier}] {v.candidate_id} {author}: {description[:60]} -> {verdict} {figure} ({v.wall_s:.0f} s)" + (
        "" if v.accepted else f": {v.reason[:100]}")


def precision_flags(precision: dict[str, Any]) -> str:
    """The flags that select a run's precision mode (a `CompileConfig.precision` record)."""
    if precision.get("mode") == "quality":
        return f"--quality-budget {QualityBudget(**precision['quality_budget'])}"
    return "--bitwise" if precision.get("mode") == "bitwise" else "neither --bitwise nor --quality-budget"


def model_summary(spec: Any, config: CompileConfig) -> str:
    kind = f"MoE {spec.moe.num_experts}x top-{spec.moe.top_k}" if spec.moe else "dense"
    quality = config.quality
    return (f"{spec.name}: {kind}, {spec.num_layers} layers, hidden {spec.hidden_size}, heads {spec.num_heads}/"
            f"{spec.num_kv_heads} (q/kv), head_dim {spec.head_dim}, vocab {spec.vocab_size}; "
            f"device {config.device}, dtype {config.dtype or 'as stored'}"
            + (f"; quality mode: lossy candidates (e.g. lower-precision weights) are admitted within a mean KL "
               f"divergence of {quality.max_kl:g} and a perplexity increase of {100 * quality.max_ppl_increase:g}%"
               if quality is not None else ""))
