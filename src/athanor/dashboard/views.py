"""What each dashboard page shows, read from the store into plain dataclasses (the templates render them).

Everything here only reads. Store text (sources, descriptions, reasons, posts) is carried as it is: escaping is the
templates' job, done by Jinja's autoescape, so no view builds markup.
"""

from __future__ import annotations

import difflib
import math
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from athanor.errors import ConfigError
from athanor.store import CandidateRecord, Deployment, EvaluationRecord, LeaderboardEntry, Post, Run, Store
from athanor.store.records import TrafficSnapshot

LINEAGE_DEPTH = 20
"""Ancestors shown on a candidate's page (a search can chain many)."""


def _finite(x: float | None) -> bool:
    return x is not None and not math.isnan(x)


@dataclass(frozen=True)
class RunSummary:
    """One row of the runs list."""

    run: Run
    elapsed_s: float
    budget_s: float | None
    evaluations: int
    winner_id: str | None
    speedup: dict[str, Any] = field(default_factory=dict)
    """The verified winner's median and interval (empty before one)."""


@dataclass(frozen=True)
class AgentRow:
    """An agent's share of a run: what it proposed, what that cost, what came of it."""

    name: str
    proposals: int
    evaluations: int
    accepted: int
    wall_s: float
    share: float
    """Of the run's evaluation time, the share its candidates took."""
    best: float | None
    """Its best accepted speedup (median)."""

    @property
    def yield_(self) -> float:
        """Accepted verdicts per evaluation."""
        return self.accepted / self.evaluations if self.evaluations else 0.0


@dataclass(frozen=True)
class TierRow:
    tier: str
    evaluations: int
    wall_s: float
    median_s: float


@dataclass(frozen=True)
class SpeedupPoint:
    """One verdict on the speedup-over-time chart."""

    minutes: float
    median: float
    ci_low: float
    ci_high: float
    tier: str
    accepted: bool
    candidate_id: str


@dataclass(frozen=True)
class RunView:
    run: Run
    elapsed_s: float
    budget_s: float | None
    leaderboard: list[LeaderboardEntry]
    verdicts: list[EvaluationRecord]
    """Newest first."""
    agents: list[AgentRow]
    tiers: list[TierRow]
    posts: list[Post]
    points: list[SpeedupPoint]
    winner_id: str | None

    @property
    def budget_share(self) -> float | None:
        return min(1.0, self.elapsed_s / self.budget_s) if self.budget_s else None


@dataclass(frozen=True)
class ShapeRow:
    """One step shape's paired timing of a verdict."""

    tier: str
    kind: str
    batch_size: int
    tokens: int
    context_len: int
    candidate_ms: float
    incumbent_ms: float
    speedup: float | None
    roofline_share: float | None
    """The step's physical floor (bytes / bandwidth) over its measured time."""
    weight: float

    @property
    def label(self) -> str:
        what = f"{self.tokens} tok" if self.kind == "prefill" else f"b{self.batch_size}"
        return f"{self.tier} {self.kind} {what} @{self.context_len}"


@dataclass(frozen=True)
class DiffLine:
    kind: str
    """"add", "del", "hunk" or "same"."""
    text: str


@dataclass(frozen=True)
class MoveChange:
    name: str
    parent: Any
    value: Any


@dataclass(frozen=True)
class CandidateView:
    run_id: str
    candidate: CandidateRecord
    lineage: list[CandidateRecord]
    """From the oldest known ancestor to the candidate itself."""
    moves: list[MoveChange]
    """Template options that differ from the parent's (empty where either is not a template render)."""
    diff: list[DiffLine]
    verdicts: list[EvaluationRecord]
    shapes: list[ShapeRow]


@dataclass(frozen=True)
class DeploymentView:
    deployment: Deployment
    phases: list[tuple[str, float]]
    figures: dict[str, Any]


@dataclass(frozen=True)
class SnapshotRow:
    """One traffic snapshot on the drift timeline."""

    snapshot: TrafficSnapshot
    requests: int
    mean_input: float
    mean_output: float
    moved: list[str]
    recompile: dict[str, Any]
    """What the drift led to ({} when it warranted nothing): session, status, winner, deployment."""
    note: str


@dataclass(frozen=True)
class TrafficView:
    latest: TrafficSnapshot | None
    timeline: list[SnapshotRow]
    """Oldest first."""


def open_reader(location: str) -> Store:
    """The store at `location`, read-only (the dashboard never writes)."""
    from athanor.store import open_store

    return open_store(location, read_only=True)


def _elapsed(run: Run) -> float:
    return (run.finished_at or time.time()) - run.started_at


def _budget(run: Run) -> float | None:
    value = run.config.get("budget_s")
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def runs_overview(store: Store, limit: int = 100) -> list[RunSummary]:
    out = []
    for run in store.runs(limit):
        s = run.summary or {}
        winner = s.get("winner_id") if s.get("verified") else None
        out.append(RunSummary(run, _elapsed(run), _budget(run), store.counts(run.id)["evaluations"], winner,
                              dict(s.get("speedup") or {}) if winner else {}))
    return out


def _agents(candidates: list[CandidateRecord], evaluations: list[EvaluationRecord]) -> list[AgentRow]:
    proposals: dict[str, int] = defaultdict(int)
    for c in candidates:
        proposals[c.author] += 1
    by_author: dict[str, list[EvaluationRecord]] = defaultdict(list)
    for ev in evaluations:
        by_author[ev.author] += [ev]
    total = sum(ev.wall_s for ev in evaluations) or 1.0
    rows = []
    for name in sorted(set(proposals) | set(by_author)):
        evs = by_author.get(name, [])
        wins = [ev.speedup for ev in evs if ev.accepted and _finite(ev.speedup)]
        rows.append(AgentRow(name, proposals.get(name, 0), len(evs), sum(ev.accepted for ev in evs),
                             sum(ev.wall_s for ev in evs), sum(ev.wall_s for ev in evs) / total,
                             max(wins) if wins else None))
    return rows


def _tiers(evaluations: list[EvaluationRecord]) -> list[TierRow]:
    by_tier: dict[str, list[float]] = defaultdict(list)
    for ev in evaluations:
        by_tier[ev.tier].append(ev.wall_s)
    return [TierRow(tier, len(w), sum(w), statistics.median(w)) for tier, w in sorted(by_tier.items())]


def run_view(store: Store, run_id: str) -> RunView | None:
    run = store.get_run(run_id)
    if run is None:
        return None
    evaluations = store.evaluations(run_id)
    points = [SpeedupPoint((ev.created_at - run.started_at) / 60, ev.speedup, ev.speedup_ci_low, ev.speedup_ci_high,
                           ev.tier, ev.accepted, ev.candidate_id)
              for ev in evaluations if _finite(ev.speedup)]
    s = run.summary or {}
    return RunView(run, _elapsed(run), _budget(run), store.leaderboard(run_id, 20), evaluations[::-1],
                   _agents(store.candidates(run_id), evaluations), _tiers(evaluations),
                   store.posts(run_id, limit=100)[::-1], points, s.get("winner_id") if s.get("verified") else None)


def _options(source: str) -> dict[str, Any] | None:
    from athanor.moves.render import read_options

    try:
        return read_options(source)
    except ConfigError:
        return None


def _diff(parent: str, source: str) -> list[DiffLine]:
    lines = []
    for line in difflib.unified_diff(parent.splitlines(), source.splitlines(), "parent", "candidate", n=3,
                                     lineterm=""):
        if line.startswith(("---", "+++")):
            continue
        kind = "hunk" if line.startswith("@@") else "add" if line.startswith("+") else \
            "del" if line.startswith("-") else "same"
        lines.append(DiffLine(kind, line))
    return lines


def _shapes(evaluations: list[EvaluationRecord]) -> list[ShapeRow]:
    rows = []
    for ev in evaluations:
        for tier in ev.figures.get("tiers") or ():
            for m in tier.get("measurements") or ():
                cand, inc, floor = m.get("candidate_s"), m.get("incumbent_s"), m.get("floor_s")
                if not cand:
                    continue
                speedup = (m.get("speedup") or {}).get("median")
                rows.append(ShapeRow(str(tier.get("tier", ev.tier)), str(m.get("kind", "")), int(m.get("batch_size", 0)),
                                     int(m.get("tokens", 0)), int(m.get("context_len", 0)), 1000 * cand,
                                     1000 * (inc or 0.0), speedup, floor / cand if floor else None,
                                     float(m.get("weight") or 0.0)))
    return rows


def candidate_view(store: Store, run_id: str, candidate_id: str) -> CandidateView | None:
    record = store.get_candidate(run_id, candidate_id)
    if record is None:
        return None
    lineage = [record]
    while lineage[0].parent_id and len(lineage) < LINEAGE_DEPTH:
        parent = store.get_candidate(run_id, lineage[0].parent_id)
        if parent is None or parent in lineage:
            break
        lineage.insert(0, parent)
    parent = lineage[-2] if len(lineage) > 1 else None
    moves: list[MoveChange] = []
    diff: list[DiffLine] = []
    if parent is not None:
        diff = _diff(parent.source, record.source)
        mine, theirs = _options(record.source), _options(parent.source)
        if mine is not None and theirs is not None:
            moves = [MoveChange(k, theirs.get(k), v) for k, v in sorted(mine.items()) if theirs.get(k) != v]
    verdicts = store.evaluations(run_id, candidate_id=candidate_id)
    return CandidateView(run_id, record, lineage, moves, diff, verdicts, _shapes(verdicts))


def deployments_view(store: Store, limit: int = 100) -> list[DeploymentView]:
    out = []
    for d in store.deployments(limit=limit):
        phases = [(str(p.get("phase", "")), float(p.get("at", 0.0))) for p in d.details.get("phases") or ()]
        out.append(DeploymentView(d, phases, dict(d.details.get("figures") or {})))
    return out


def traffic_view(store: Store, limit: int = 200) -> TrafficView:
    snapshots = store.traffic_snapshots(limit=limit)[::-1]
    rows = []
    for snap in snapshots:
        p, drift = snap.profile, snap.drift
        rows.append(SnapshotRow(snap, int(p.get("num_requests", 0)), float((p.get("input") or {}).get("mean", 0.0)),
                                float((p.get("output") or {}).get("mean", 0.0)), list(drift.get("moved") or ()),
                                dict(drift.get("recompile") or {}), str(drift.get("note", ""))))
    return TrafficView(snapshots[-1] if snapshots else None, rows)
