"""Ordered schema migrations and the `schema_version` table that records which ran.

Each `Migration` is history: it builds its own table definitions instead of importing
`schema.py`, so it creates exactly what it created when it was written, and the next step alters
that. `migrate` runs the missing steps in one write transaction under a lock (SQLite's write lock
via BEGIN IMMEDIATE, a PostgreSQL advisory lock), so processes opening a store at once migrate it
once. Alembic would do the same with more machinery than six tables need.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa

from athanor.errors import ConfigError

log = logging.getLogger(__name__)

_PG_MIGRATION_LOCK = 0x617468616E6F72  # "athanor": any constant shared by every athanor process

RowId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


@dataclass(frozen=True)
class Migration:
    """One step from `version - 1` to `version`."""

    version: int
    description: str
    apply: Callable[[sa.Connection], None]


def _v1_core(conn: sa.Connection) -> None:
    md = sa.MetaData()
    sa.Table(
        "runs", md,
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("traffic", sa.Text, nullable=False),
        sa.Column("device", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("finished_at", sa.Float),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("summary", sa.JSON, nullable=False),
    )
    sa.Table(
        "candidates", md,
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id"), primary_key=True),
        sa.Column("id", sa.String(16), primary_key=True),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("parent_id", sa.String(16), nullable=False),
        sa.Column("author", sa.Text, nullable=False),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("manifest", sa.JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    sa.Table(
        "evaluations", md,
        sa.Column("id", RowId, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("candidate_id", sa.String(16), nullable=False),
        sa.Column("tier", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("accepted", sa.Boolean, nullable=False),
        sa.Column("stage", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("speedup", sa.Float),
        sa.Column("speedup_ci_low", sa.Float),
        sa.Column("speedup_ci_high", sa.Float),
        sa.Column("gpu_s_per_1k", sa.Float),
        sa.Column("shapes", sa.JSON, nullable=False),
        sa.Column("figures", sa.JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    md.create_all(conn)


def _v2_board_and_costs(conn: sa.Connection) -> None:
    # The budget needs each evaluation's cost, and A/B figures mean little without the incumbent.
    conn.execute(sa.text("ALTER TABLE evaluations ADD COLUMN incumbent_id VARCHAR(16) NOT NULL DEFAULT ''"))
    conn.execute(sa.text("ALTER TABLE evaluations ADD COLUMN wall_s FLOAT NOT NULL DEFAULT 0"))
    md = sa.MetaData()
    sa.Table("runs", md, sa.Column("id", sa.String(64), primary_key=True))
    sa.Table(
        "posts", md,
        sa.Column("id", RowId, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("agent", sa.Text, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("candidate_id", sa.String(16)),
        sa.Column("created_at", sa.Float, nullable=False),
    ).create(conn)


def _v3_deployments_and_traffic(conn: sa.Connection) -> None:
    md = sa.MetaData()
    sa.Table(
        "deployments", md,
        sa.Column("id", RowId, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(64)),
        sa.Column("candidate_id", sa.String(16), nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("details", sa.JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    sa.Table(
        "traffic_snapshots", md,
        sa.Column("id", RowId, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(64)),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("profile", sa.JSON, nullable=False),
        sa.Column("drift", sa.JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    md.create_all(conn)
    # The hot queries: a run's verdicts newest first, and the board since a post id.
    conn.execute(sa.text("CREATE INDEX ix_evaluations_run_id ON evaluations (run_id, id)"))
    conn.execute(sa.text("CREATE INDEX ix_posts_run_id ON posts (run_id, id)"))


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "runs, candidates, evaluations", _v1_core),
    Migration(2, "evaluation cost and incumbent; board posts", _v2_board_and_costs),
    Migration(3, "deployments, traffic snapshots, indexes", _v3_deployments_and_traffic),
)
LATEST_VERSION = MIGRATIONS[-1].version


def _version_table() -> sa.Table:
    return sa.Table(
        "schema_version", sa.MetaData(),
        sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("applied_at", sa.Float, nullable=False),
    )


def current_version(conn: sa.Connection) -> int:
    """The highest applied migration, 0 for an empty database."""
    if not sa.inspect(conn).has_table("schema_version"):
        return 0
    version = conn.execute(sa.select(sa.func.max(_version_table().c.version))).scalar()
    return int(version or 0)


def migrate(engine: sa.Engine, target: int = LATEST_VERSION, *, where: str = "") -> int:
    """Bring the database at `engine` up to `target`; return the version it has afterwards.

    Raises ConfigError when the database is newer than this code knows (`where` names it).
    """
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
        version_table = _version_table()
        version_table.create(conn, checkfirst=True)
        version = current_version(conn)
        if version > LATEST_VERSION:
            raise ConfigError(
                f"store {where}: schema version {version} is newer than this athanor knows "
                f"({LATEST_VERSION}); upgrade athanor or use another store")
        for step in MIGRATIONS:
            if version < step.version <= target:
                log.info("store %s: migrating to schema version %d (%s)", where, step.version, step.description)
                step.apply(conn)
                conn.execute(sa.insert(version_table).values(
                    version=step.version, description=step.description, applied_at=time.time()))
                version = step.version
        return version
