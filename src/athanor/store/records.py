"""The store's typed records: frozen, JSON-friendly dataclasses returned by `Store` queries.

Rows cross the store's seam only as these records, so callers (the compile loop, agents, the
dashboard) never see SQLAlchemy rows. Times are Unix seconds (float); figures that the evaluator
could not measure are `nan` here and NULL in the database.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

PostKind = Literal["idea", "result", "warning"]
POST_KINDS: tuple[str, ...] = ("idea", "result", "warning")

RunStatus = Literal["running", "finished", "interrupted", "failed"]
VerdictStatus = Literal["accepted", "rejected", "error"]


@dataclass(frozen=True)
class Run:
    """One compile session: what was compiled, for which traffic, and how it ended."""

    id: str
    model: str
    traffic: str
    device: str
    status: str
    """"running", "finished", "interrupted" or "failed"."""
    started_at: float
    finished_at: float | None = None
    config: dict[str, Any] = field(default_factory=dict)
    """The run's configuration as given (flags, budget), for `--resume` and reports."""
    summary: dict[str, Any] = field(default_factory=dict)
    """Written by `finish_run`: the winner, speedup, counts."""


@dataclass(frozen=True)
class CandidateRecord:
    """A candidate's source and manifest as stored; `id` is its content hash's first 16 hex digits."""

    run_id: str
    id: str
    content_hash: str
    source: str
    parent_id: str
    """The candidate it was derived from ("" for a baseline)."""
    author: str
    """The agent that proposed it."""
    description: str
    manifest: dict[str, Any]
    created_at: float


@dataclass(frozen=True)
class EvaluationRecord:
    """One evaluation of a candidate on one tier: its verdict and figures."""

    id: int
    run_id: str
    candidate_id: str
    incumbent_id: str
    author: str
    """The candidate's author agent (joined from the candidates table)."""
    tier: str
    """"fast", "slow" or "both"."""
    status: str
    """"accepted", "rejected" or "error" (the evaluator could not judge)."""
    accepted: bool
    stage: str
    """The last stage passed (winner: "accepted") or the stage that failed."""
    reason: str
    """One line: why it failed, or the headline figure of a winner."""
    speedup: float
    speedup_ci_low: float
    speedup_ci_high: float
    gpu_s_per_1k: float
    """Projected device-seconds per 1,000 requests of the candidate (lower is better)."""
    wall_s: float
    """Seconds the evaluation took (the budget's cost)."""
    shapes: tuple[dict[str, Any], ...]
    figures: dict[str, Any]
    """The evaluator's full figures (e.g. `Verdict.to_dict()`)."""
    created_at: float


@dataclass(frozen=True)
class LeaderboardEntry:
    """A candidate's best accepted evaluation, ranked by projected cost."""

    rank: int
    candidate_id: str
    parent_id: str
    author: str
    description: str
    tier: str
    speedup: float
    speedup_ci_low: float
    speedup_ci_high: float
    gpu_s_per_1k: float
    evaluation_id: int


@dataclass(frozen=True)
class Post:
    """A message on the board: an idea, a result or a warning, optionally about a candidate."""

    id: int
    run_id: str
    agent: str
    kind: str
    """"idea", "result" or "warning"."""
    text: str
    candidate_id: str | None
    created_at: float


@dataclass(frozen=True)
class Deployment:
    """A candidate put into service (or taken out): canary, live, rolled back, retired."""

    id: int
    run_id: str | None
    candidate_id: str
    target: str
    """Where it serves: a server URL or name."""
    status: str
    reason: str
    details: dict[str, Any]
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class TrafficSnapshot:
    """A traffic profile as observed at one time (a `TrafficProfile.to_dict()`), with its source."""

    id: int
    run_id: str | None
    source: str
    """A trace path, "preset:NAME" or "live:URL"."""
    profile: dict[str, Any]
    drift: dict[str, Any]
    """The drift test's figures against the previous snapshot ({} for the first)."""
    created_at: float
