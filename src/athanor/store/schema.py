"""The store's current tables (SQLAlchemy Core), as the migrations in `migrations.py` leave them.

Queries use these `Table` objects; the migrations create and alter the database step by step and
never import them (a migration is history: it must keep meaning what it meant when written). A
unit test checks that a freshly migrated database has exactly these columns.

Ids: runs have a text id (given or generated), candidates the first 16 hex digits of their content
hash (the engine's `Candidate.id`), scoped by run; every other row an autoincrement integer.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

# BIGSERIAL on PostgreSQL, the rowid alias on SQLite (which only autoincrements INTEGER keys).
RowId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

schema_version = sa.Table(
    "schema_version", metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("description", sa.Text, nullable=False),
    sa.Column("applied_at", sa.Float, nullable=False),
)

runs = sa.Table(
    "runs", metadata,
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

candidates = sa.Table(
    "candidates", metadata,
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

evaluations = sa.Table(
    "evaluations", metadata,
    sa.Column("id", RowId, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id"), nullable=False),
    sa.Column("candidate_id", sa.String(16), nullable=False),
    sa.Column("incumbent_id", sa.String(16), nullable=False),
    sa.Column("tier", sa.String(16), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("accepted", sa.Boolean, nullable=False),
    sa.Column("stage", sa.String(32), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("speedup", sa.Float),
    sa.Column("speedup_ci_low", sa.Float),
    sa.Column("speedup_ci_high", sa.Float),
    sa.Column("gpu_s_per_1k", sa.Float),
    sa.Column("wall_s", sa.Float, nullable=False),
    sa.Column("shapes", sa.JSON, nullable=False),
    sa.Column("figures", sa.JSON, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)

posts = sa.Table(
    "posts", metadata,
    sa.Column("id", RowId, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id"), nullable=False),
    sa.Column("agent", sa.Text, nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("candidate_id", sa.String(16)),
    sa.Column("created_at", sa.Float, nullable=False),
)

deployments = sa.Table(
    "deployments", metadata,
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

traffic_snapshots = sa.Table(
    "traffic_snapshots", metadata,
    sa.Column("id", RowId, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.String(64)),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("profile", sa.JSON, nullable=False),
    sa.Column("drift", sa.JSON, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)
