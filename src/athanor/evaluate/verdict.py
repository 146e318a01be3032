"""`Verdict` and `Measurement`: what one evaluation concludes, as frozen, JSON-serialisable dataclasses.

The evaluator produces them, the store records them and the CLI prints them. A rejected
candidate is a verdict (data), never an exception: `stage` names the last stage passed or the
one that failed, `reason` says why in one line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

STAGES = ("static", "smoke", "correctness", "integrity", "timing", "slow", "accepted")
"""The cascade in order (docs/architecture.md, "The evaluator"); `accepted` is reached only by a winner."""


@dataclass(frozen=True)
class Speedup:
    """Incumbent time / candidate time (the ratio of each side's lower-quartile step time, or the median
    of per-step ratios; `timing` says which and why) and its bootstrap 95% interval."""

    median: float = float("nan")
    ci_low: float = float("nan")
    ci_high: float = float("nan")
    num_pairs: int = 0

    def contains_one(self) -> bool:
        return self.ci_low <= 1.0 <= self.ci_high


@dataclass(frozen=True)
class Measurement:
    """Paired timings of one step shape, candidate (B) against incumbent (A)."""

    kind: str
    """"decode" or "prefill"."""
    batch_size: int
    """Rows (decode) or sequences (prefill)."""
    tokens: int
    """New tokens per sequence: 1 for decode, the chunk length for prefill."""
    context_len: int
    """Cached tokens before the step."""
    num_layers: int
    candidate_s: float
    """Seconds per step of the candidate (the lower quartile of its timings: undisturbed time)."""
    incumbent_s: float
    speedup: Speedup = field(default_factory=Speedup)
    weight: float = 0.0
    """Share of the workload's time this shape stands for (the objective's weight)."""
    floor_s: float = 0.0
    """Physical limit: bytes the step must move / measured bandwidth."""
    paired: bool = False
    """The speedup is the median of per-step ratios (steps explain the times) rather than the ratio of
    lower quartiles (independent, one-sided noise); see `timing.is_paired`."""
    incumbent_cv: float = float("nan")
    """Robust coefficient of variation of the incumbent's step times (steps' own differences included)."""
    candidate_cv: float = float("nan")
    repeatability: float = float("nan")
    """Run-to-run spread of the incumbent on the same step (robust std of log(A / A') / sqrt 2)."""


@dataclass(frozen=True)
class TierResult:
    """One tier's figures."""

    tier: str
    num_layers: int
    measurements: tuple[Measurement, ...] = ()
    speedup: Speedup = field(default_factory=Speedup)
    """Of the objective (the workload-weighted step time)."""
    noise: Speedup = field(default_factory=Speedup)
    """The A/A interval of the incumbent against itself (the noise floor)."""
    candidate_gpu_s_per_1k: float = float("nan")
    incumbent_gpu_s_per_1k: float = float("nan")
    max_abs_err: float = float("nan")
    greedy_agreement: float = float("nan")
    kl: float = float("nan")
    ppl_change: float = float("nan")


@dataclass(frozen=True)
class Verdict:
    """The outcome of evaluating one candidate against an incumbent."""

    candidate_id: str
    incumbent_id: str
    accepted: bool
    stage: str
    """The last stage passed (for a winner: "accepted") or the stage that failed."""
    reason: str
    status: str = "rejected"
    """"accepted", "rejected" (the candidate failed a stage) or "error" (the evaluator could not judge)."""
    speedup: Speedup = field(default_factory=Speedup)
    gpu_s_per_1k_requests: float = float("nan")
    """Projected device-seconds per 1,000 requests of the traffic, for the candidate."""
    incumbent_gpu_s_per_1k_requests: float = float("nan")
    tiers: tuple[TierResult, ...] = ()
    compile_s: float = 0.0
    """Build, capture and first-step seconds of the candidate (the experiment's cost)."""
    wall_s: float = 0.0
    stages: tuple[tuple[str, float], ...] = ()
    """(stage, seconds) of every stage run."""
    model: str = ""
    device: str = ""
    versions: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return _plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Verdict:
        """The verdict `to_dict` wrote, its figures that were NaN (written as null) NaN again."""
        tiers = tuple(TierResult(**{**_nan(t), "measurements": tuple(
            Measurement(**{**_nan(m), "speedup": Speedup(**_nan(m["speedup"]))}) for m in t["measurements"]),
            "speedup": Speedup(**_nan(t["speedup"])), "noise": Speedup(**_nan(t["noise"]))})
            for t in raw.get("tiers", ()))
        fields = {f.name: f for f in dataclasses.fields(cls)}
        rest = {k: v for k, v in _nan(raw, fields).items() if k in fields and k not in ("tiers", "speedup", "stages")}
        return cls(**rest, tiers=tiers, speedup=Speedup(**_nan(raw.get("speedup", {}))),
                   stages=tuple((str(a), float(b)) for a, b in raw.get("stages", ())))


def _nan(raw: dict[str, Any], fields: dict[str, dataclasses.Field[Any]] | None = None) -> dict[str, Any]:
    """`raw` with the None that `_plain` wrote for a NaN figure as NaN again: every None, or with `fields` only those
    of float fields (a None there may mean none)."""
    return {k: float("nan") if v is None and (fields is None or (k in fields and fields[k].type == "float")) else v
            for k, v in raw.items()}


def _plain(value: Any) -> Any:
    """JSON-safe: NaN and infinities become None, tuples lists."""
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
