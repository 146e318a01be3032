"""`Store`: the experiment database's API — runs, candidates, evaluations, the board, deployments
and traffic snapshots, in SQLite (default) or PostgreSQL.

One `Store` per process, shared by its threads (SQLAlchemy's pool hands each thread its own
connection). Several processes may open the same database at once: each write is one short
transaction, retried on lock races, so concurrent agents and evaluators lose no rows. A `Store`
pickles as its location, so a child process reopens it instead of sharing sockets.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc

from athanor.errors import ConfigError
from athanor.store import schema as t
from athanor.store.connect import create_engine, database_url, with_retries
from athanor.store.migrations import LATEST_VERSION, current_version, migrate
from athanor.store.records import (
    POST_KINDS,
    CandidateRecord,
    Deployment,
    EvaluationRecord,
    LeaderboardEntry,
    Post,
    Run,
    TrafficSnapshot,
)
from athanor.store.rows import (
    candidate_from_row,
    deployment_from_row,
    evaluation_from_row,
    evaluation_values_from_verdict,
    nan_to_none,
    plain,
    post_from_row,
    run_from_row,
    snapshot_from_row,
)

T = TypeVar("T")


def candidate_id_of(source: str) -> str:
    """The id a candidate's source gets: the first 16 hex digits of its sha256 (as `engine.Candidate.id`)."""
    return hashlib.sha256(source.encode()).hexdigest()[:16]


class Store:
    """The experiment database at `location`: a run directory, a SQLite file or a PostgreSQL URL."""

    def __init__(self, location: str | Path, *, read_only: bool = False) -> None:
        """`read_only`: open an existing store for reading only (SQLite `mode=ro`, PostgreSQL read-only
        transactions), never creating or migrating it; a write then fails in the database itself."""
        self._location = str(location)
        self.read_only = read_only
        url = database_url(location, must_exist=read_only)
        self.url = sa.make_url(url).render_as_string(hide_password=True)
        """Where the store lives, with any password hidden (for messages and logs)."""
        self._engine = create_engine(url, read_only=read_only)
        self._reader = self._engine.execution_options(athanor_write=False)
        try:
            if read_only:
                self._check_version()
            else:
                migrate(self._engine, where=self.url)
        except exc.OperationalError as e:
            self._engine.dispose()
            raise ConfigError(f"store {self.url}: cannot open ({str(e.orig).strip().splitlines()[0]})") from None
        # A forked child must not reuse the parent's pooled connections (SQLAlchemy's advice).
        engine_ref = weakref.ref(self._engine)
        os.register_at_fork(after_in_child=lambda: _dispose_in_child(engine_ref))

    def __reduce__(self) -> tuple[Callable[..., Store], tuple[str]]:
        return (Store, (self._location,))

    def _check_version(self) -> None:
        """A store opened read-only is read as it is: it must be at the schema this code queries."""
        with self._reader.connect() as conn:
            version = current_version(conn)
        if version != LATEST_VERSION:
            self._engine.dispose()
            what = "no athanor store" if version == 0 else f"a store at schema version {version}"
            fix = ("upgrade athanor" if version > LATEST_VERSION else
                   "point at a run directory or store URL that a compile or a server wrote" if version == 0 else
                   "open it once with a writer (athanor compile --resume, athanor serve --store) to migrate it")
            raise ConfigError(f"store {self.url}: {what}; this athanor reads version {LATEST_VERSION}: {fix}")

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._engine.dispose()

    def schema_version(self) -> int:
        with self._reader.connect() as conn:
            return current_version(conn)

    # -- plumbing ------------------------------------------------------------------------------

    def _write(self, what: str, work: Callable[[sa.Connection], T]) -> T:
        def attempt() -> T:
            with self._engine.begin() as conn:
                return work(conn)

        return with_retries(attempt, what=what)

    def _read(self, query: sa.Select[Any]) -> Sequence[sa.Row[Any]]:
        with self._reader.connect() as conn:
            return conn.execute(query).all()

    # -- runs ----------------------------------------------------------------------------------

    def add_run(self, model: str, traffic: str, device: str, *, config: Mapping[str, Any] | None = None,
                run_id: str | None = None) -> Run:
        """Start a run; `run_id` defaults to a fresh one (date + random suffix)."""
        run_id = run_id or time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        values = dict(id=run_id, model=model, traffic=traffic, device=device, status="running",
                      started_at=time.time(), finished_at=None, config=plain(dict(config or {})), summary={})

        def work(conn: sa.Connection) -> None:
            if conn.execute(sa.select(t.runs.c.id).where(t.runs.c.id == run_id)).first() is not None:
                raise ConfigError(f"store {self.url}: a run named {run_id!r} exists already; "
                                  "pass --resume to continue it or choose another name")
            conn.execute(sa.insert(t.runs).values(**values))

        self._write("add_run", work)
        return run_from_row(values)

    def get_run(self, run_id: str) -> Run | None:
        rows = self._read(sa.select(t.runs).where(t.runs.c.id == run_id))
        return run_from_row(rows[0]._mapping) if rows else None

    def runs(self, limit: int = 50) -> list[Run]:
        """The newest runs first."""
        rows = self._read(sa.select(t.runs).order_by(t.runs.c.started_at.desc()).limit(limit))
        return [run_from_row(r._mapping) for r in rows]

    def _set_run(self, run_id: str, **values: Any) -> Run:
        def work(conn: sa.Connection) -> None:
            if conn.execute(sa.update(t.runs).where(t.runs.c.id == run_id).values(**values)).rowcount != 1:
                raise ConfigError(f"store {self.url}: no run named {run_id!r}")

        self._write("update run", work)
        run = self.get_run(run_id)
        assert run is not None
        return run

    def finish_run(self, run_id: str, status: str = "finished", summary: Mapping[str, Any] | None = None) -> Run:
        """Mark a run ended ("finished", "interrupted" or "failed") and keep its summary."""
        return self._set_run(run_id, status=status, finished_at=time.time(), summary=plain(dict(summary or {})))

    def resume_run(self, run_id: str) -> Run:
        """Mark an ended run running again (`--resume`); ConfigError if there is no such run."""
        return self._set_run(run_id, status="running", finished_at=None)

    # -- candidates ----------------------------------------------------------------------------

    def add_candidate(self, run_id: str, source: str, *, parent_id: str = "", author: str = "",
                      description: str = "", manifest: Mapping[str, Any] | None = None) -> CandidateRecord:
        """Record a candidate; adding the same source to a run again returns the first record."""
        content_hash = hashlib.sha256(source.encode()).hexdigest()
        values = dict(run_id=run_id, id=content_hash[:16], content_hash=content_hash, source=source,
                      parent_id=parent_id, author=author, description=description,
                      manifest=plain(dict(manifest or {})), created_at=time.time())
        try:
            self._write("add_candidate", lambda conn: conn.execute(sa.insert(t.candidates).values(**values)))
        except exc.IntegrityError:
            existing = self.get_candidate(run_id, content_hash[:16])
            if existing is None:  # the run does not exist (foreign key)
                raise ConfigError(f"store {self.url}: no run named {run_id!r}") from None
            return existing
        return candidate_from_row(values)

    def get_candidate(self, run_id: str, candidate_id: str) -> CandidateRecord | None:
        rows = self._read(sa.select(t.candidates).where(
            t.candidates.c.run_id == run_id, t.candidates.c.id == candidate_id))
        return candidate_from_row(rows[0]._mapping) if rows else None

    def candidates(self, run_id: str, *, author: str | None = None) -> list[CandidateRecord]:
        """A run's candidates, oldest first."""
        query = sa.select(t.candidates).where(t.candidates.c.run_id == run_id)
        if author is not None:
            query = query.where(t.candidates.c.author == author)
        return [candidate_from_row(r._mapping) for r in self._read(query.order_by(t.candidates.c.created_at))]

    # -- evaluations ---------------------------------------------------------------------------

    def record_evaluation(self, run_id: str, candidate_id: str, *, tier: str, status: str, stage: str,
                          reason: str, accepted: bool | None = None, incumbent_id: str = "",
                          speedup: float = math.nan, speedup_ci_low: float = math.nan,
                          speedup_ci_high: float = math.nan, gpu_s_per_1k: float = math.nan,
                          wall_s: float = 0.0, shapes: Iterable[Mapping[str, Any]] = (),
                          figures: Mapping[str, Any] | None = None) -> EvaluationRecord:
        """Record one evaluation's verdict (`status`: accepted, rejected or error) and figures."""
        values = dict(
            run_id=run_id, candidate_id=candidate_id, incumbent_id=incumbent_id, tier=tier, status=status,
            accepted=status == "accepted" if accepted is None else accepted, stage=stage, reason=reason,
            speedup=nan_to_none(speedup), speedup_ci_low=nan_to_none(speedup_ci_low),
            speedup_ci_high=nan_to_none(speedup_ci_high), gpu_s_per_1k=nan_to_none(gpu_s_per_1k),
            wall_s=float(wall_s), shapes=plain([dict(s) for s in shapes]), figures=plain(dict(figures or {})),
            created_at=time.time())
        new_id = self._write("record_evaluation", lambda conn: _insert(conn, t.evaluations, values))
        return evaluation_from_row({**values, "id": new_id, "author": self._author(run_id, candidate_id)})

    def record_verdict(self, run_id: str, verdict: Mapping[str, Any], *, tier: str = "") -> EvaluationRecord:
        """Record a `Verdict.to_dict()` from the evaluator (figures kept whole)."""
        return self.record_evaluation(run_id, **evaluation_values_from_verdict(verdict, tier))

    def _author(self, run_id: str, candidate_id: str) -> str:
        rows = self._read(sa.select(t.candidates.c.author).where(
            t.candidates.c.run_id == run_id, t.candidates.c.id == candidate_id))
        return str(rows[0][0]) if rows else ""

    def _evaluations_query(self) -> sa.Select[Any]:
        joined = t.evaluations.outerjoin(t.candidates, sa.and_(
            t.candidates.c.run_id == t.evaluations.c.run_id, t.candidates.c.id == t.evaluations.c.candidate_id))
        author = sa.func.coalesce(t.candidates.c.author, "").label("author")
        return sa.select(t.evaluations, author).select_from(joined)

    def evaluations(self, run_id: str, *, candidate_id: str | None = None) -> list[EvaluationRecord]:
        """A run's evaluations, oldest first."""
        query = self._evaluations_query().where(t.evaluations.c.run_id == run_id)
        if candidate_id is not None:
            query = query.where(t.evaluations.c.candidate_id == candidate_id)
        return [evaluation_from_row(r._mapping) for r in self._read(query.order_by(t.evaluations.c.id))]

    def recent_verdicts(self, run_id: str, n: int = 20, *, author: str | None = None) -> list[EvaluationRecord]:
        """The newest `n` evaluations of a run (of one author's candidates if given), newest first."""
        query = self._evaluations_query().where(t.evaluations.c.run_id == run_id)
        if author is not None:
            query = query.where(t.candidates.c.author == author)
        rows = self._read(query.order_by(t.evaluations.c.id.desc()).limit(n))
        return [evaluation_from_row(r._mapping) for r in rows]

    def leaderboard(self, run_id: str, n: int = 10, *, tier: str | None = None) -> list[LeaderboardEntry]:
        """The `n` best candidates by their best accepted evaluation: lowest projected cost
        (`gpu_s_per_1k`), then highest speedup's lower bound."""
        query = self._evaluations_query().add_columns(t.candidates.c.parent_id, t.candidates.c.description).where(
            t.evaluations.c.run_id == run_id, t.evaluations.c.accepted.is_(True))
        if tier is not None:
            query = query.where(t.evaluations.c.tier == tier)

        def key(row: Mapping[Any, Any]) -> tuple[float, float]:
            cost = row["gpu_s_per_1k"]
            return (cost if cost is not None else math.inf, -(row["speedup_ci_low"] or 0.0))

        best: dict[str, Mapping[Any, Any]] = {}
        for row in (r._mapping for r in self._read(query)):
            current = best.get(row["candidate_id"])
            if current is None or key(row) < key(current):
                best[row["candidate_id"]] = row
        ranked = sorted(best.values(), key=key)[:n]
        return [LeaderboardEntry(
            rank=i + 1, candidate_id=r["candidate_id"], parent_id=r["parent_id"] or "", author=r["author"],
            description=r["description"] or "", tier=r["tier"], evaluation_id=int(r["id"]),
            **{k: math.nan if r[k] is None else float(r[k])
               for k in ("speedup", "speedup_ci_low", "speedup_ci_high", "gpu_s_per_1k")})
            for i, r in enumerate(ranked)]

    # -- the board -----------------------------------------------------------------------------

    def post(self, run_id: str, agent: str, kind: str, text: str, *, candidate_id: str | None = None) -> Post:
        """Put a message on the board (`kind`: idea, result or warning)."""
        if kind not in POST_KINDS:
            raise ValueError(f"post kind must be one of {', '.join(POST_KINDS)}, not {kind!r}")
        values = dict(run_id=run_id, agent=agent, kind=kind, text=text, candidate_id=candidate_id,
                      created_at=time.time())
        key = self._write("post", lambda conn: _insert(conn, t.posts, values))
        return post_from_row({**values, "id": key})

    def posts(self, run_id: str, *, since: int = 0, limit: int = 50, kinds: Sequence[str] | None = None) -> list[Post]:
        """The newest `limit` posts with id > `since` (ids grow with time), oldest first."""
        query = sa.select(t.posts).where(t.posts.c.run_id == run_id, t.posts.c.id > since)
        if kinds is not None:
            query = query.where(t.posts.c.kind.in_(list(kinds)))
        rows = self._read(query.order_by(t.posts.c.id.desc()).limit(limit))
        return [post_from_row(r._mapping) for r in reversed(rows)]

    # -- deployments and traffic ---------------------------------------------------------------

    def add_deployment(self, candidate_id: str, target: str, status: str, *, reason: str = "",
                       run_id: str | None = None, details: Mapping[str, Any] | None = None) -> Deployment:
        """Record a candidate going into service (status e.g. canary or live)."""
        now = time.time()
        values = dict(run_id=run_id, candidate_id=candidate_id, target=target, status=status, reason=reason,
                      details=plain(dict(details or {})), created_at=now, updated_at=now)
        key = self._write("add_deployment", lambda conn: _insert(conn, t.deployments, values))
        return deployment_from_row({**values, "id": key})

    def update_deployment(self, deployment_id: int, status: str, *, reason: str = "",
                          details: Mapping[str, Any] | None = None) -> Deployment:
        """Change a deployment's status (canary, live, rolled_back, failed, retired) and say why; `details` are
        merged into its details (a canary's phases and comparisons as they come)."""
        def work(conn: sa.Connection) -> None:
            values: dict[str, Any] = dict(status=status, reason=reason, updated_at=time.time())
            if details:
                row = conn.execute(sa.select(t.deployments.c.details).where(
                    t.deployments.c.id == deployment_id)).first()
                values["details"] = {**(row[0] if row is not None else {}), **plain(dict(details))}
            conn.execute(sa.update(t.deployments).where(t.deployments.c.id == deployment_id).values(**values))

        self._write("update_deployment", work)
        rows = self._read(sa.select(t.deployments).where(t.deployments.c.id == deployment_id))
        if not rows:
            raise ConfigError(f"store {self.url}: no deployment {deployment_id}")
        return deployment_from_row(rows[0]._mapping)

    def deployments(self, *, run_id: str | None = None, limit: int = 50) -> list[Deployment]:
        """The newest deployments first."""
        query = sa.select(t.deployments)
        if run_id is not None:
            query = query.where(t.deployments.c.run_id == run_id)
        rows = self._read(query.order_by(t.deployments.c.id.desc()).limit(limit))
        return [deployment_from_row(r._mapping) for r in rows]

    def add_traffic_snapshot(self, source: str, profile: Mapping[str, Any], *,
                             drift: Mapping[str, Any] | None = None, run_id: str | None = None) -> TrafficSnapshot:
        """Keep a traffic profile (`TrafficProfile.to_dict()`) as observed now."""
        values = dict(run_id=run_id, source=source, profile=plain(dict(profile)), drift=plain(dict(drift or {})),
                      created_at=time.time())
        key = self._write("add_traffic_snapshot", lambda conn: _insert(conn, t.traffic_snapshots, values))
        return snapshot_from_row({**values, "id": key})

    def update_traffic_snapshot(self, snapshot_id: int, drift: Mapping[str, Any]) -> None:
        """Merge `drift` into a snapshot's drift figures (what the change it showed led to, once known)."""
        def work(conn: sa.Connection) -> None:
            row = conn.execute(sa.select(t.traffic_snapshots.c.drift).where(
                t.traffic_snapshots.c.id == snapshot_id)).first()
            if row is None:
                raise ConfigError(f"store {self.url}: no traffic snapshot {snapshot_id}")
            conn.execute(sa.update(t.traffic_snapshots).where(t.traffic_snapshots.c.id == snapshot_id).values(
                drift={**row[0], **plain(dict(drift))}))

        self._write("update_traffic_snapshot", work)

    def traffic_snapshots(self, *, run_id: str | None = None, limit: int = 50) -> list[TrafficSnapshot]:
        """The newest snapshots first."""
        query = sa.select(t.traffic_snapshots)
        if run_id is not None:
            query = query.where(t.traffic_snapshots.c.run_id == run_id)
        rows = self._read(query.order_by(t.traffic_snapshots.c.id.desc()).limit(limit))
        return [snapshot_from_row(r._mapping) for r in rows]

    def counts(self, run_id: str) -> dict[str, int]:
        """Rows of a run per table (reports, tests)."""
        tables = {"candidates": t.candidates, "evaluations": t.evaluations, "posts": t.posts,
                  "deployments": t.deployments, "traffic_snapshots": t.traffic_snapshots}
        with self._reader.connect() as conn:
            return {name: int(conn.execute(sa.select(sa.func.count()).select_from(table).where(
                table.c.run_id == run_id)).scalar() or 0) for name, table in tables.items()}


def _dispose_in_child(engine_ref: weakref.ref[sa.Engine]) -> None:
    engine = engine_ref()
    if engine is not None:
        engine.dispose(close=False)


def _insert(conn: sa.Connection, table: sa.Table, values: Mapping[str, Any]) -> int:
    """Insert one row; its autoincrement id."""
    key = conn.execute(sa.insert(table).values(**values)).inserted_primary_key
    assert key is not None
    return int(key[0])


def open_store(location: str | Path, *, read_only: bool = False) -> Store:
    """Open (creating and migrating as needed) the store at `location`; see `database_url`. `read_only`: an
    existing store, for reading only (`Store`)."""
    return Store(location, read_only=read_only)


__all__ = ["LATEST_VERSION", "Store", "candidate_id_of", "open_store"]
