"""Schema migrations: an older database is brought up to date with its rows kept; the migrated
schema is exactly `schema.py`'s; a database newer than the code is refused with a clear error."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from athanor.errors import ConfigError
from athanor.store import LATEST_VERSION, open_store
from athanor.store import schema as current
from athanor.store.connect import create_engine, database_url
from athanor.store.migrations import MIGRATIONS, migrate


def test_versions_are_consecutive() -> None:
    assert [m.version for m in MIGRATIONS] == list(range(1, LATEST_VERSION + 1))


def test_migrating_from_version_1_keeps_rows(store_location: str) -> None:
    engine = create_engine(database_url(store_location))
    assert migrate(engine, target=1) == 1
    with engine.begin() as conn:
        # Rows as a version-1 athanor wrote them (no incumbent_id, no wall_s; no posts table yet).
        conn.execute(sa.text(
            "INSERT INTO runs (id, model, traffic, device, status, started_at, config, summary) "
            "VALUES ('old', 'smollm2-135m', 'preset:chat', 'cpu', 'finished', 1.0, '{}', '{}')"))
        conn.execute(sa.text(
            "INSERT INTO candidates (run_id, id, content_hash, source, parent_id, author, description, "
            "manifest, created_at) VALUES ('old', 'abcdabcdabcdabcd', 'abcd', 'x = 1', '', 'variant', 'd', '{}', 2.0)"))
        conn.execute(sa.text(
            "INSERT INTO evaluations (run_id, candidate_id, tier, status, accepted, stage, reason, speedup, "
            "speedup_ci_low, speedup_ci_high, gpu_s_per_1k, shapes, figures, created_at) VALUES "
            "('old', 'abcdabcdabcdabcd', 'fast', 'accepted', TRUE, 'accepted', '', 1.2, 1.1, 1.3, 5.0, '[]', '{}', 3.0)"))
        assert "posts" not in sa.inspect(conn).get_table_names()
    engine.dispose()

    with open_store(store_location) as store:
        assert store.schema_version() == LATEST_VERSION
        (old,) = store.evaluations("old")
        assert old.author == "variant" and old.wall_s == 0.0 and old.incumbent_id == "" and old.speedup == 1.2
        assert store.leaderboard("old")[0].candidate_id == "abcdabcdabcdabcd"
        assert store.post("old", "llm", "idea", "now there is a board").id >= 1


def test_migrated_schema_matches_schema_module(store_location: str) -> None:
    open_store(store_location).close()
    engine = create_engine(database_url(store_location))
    inspector = sa.inspect(engine)
    for table in current.metadata.sorted_tables:
        columns = {c["name"] for c in inspector.get_columns(table.name)}
        assert columns == {c.name for c in table.columns}, table.name
    engine.dispose()


def test_a_newer_database_is_refused(store_location: str) -> None:
    open_store(store_location).close()
    engine = create_engine(database_url(store_location))
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO schema_version (version, description, applied_at) "
                             "VALUES (:v, 'from the future', 0)"), {"v": LATEST_VERSION + 1})
    engine.dispose()
    with pytest.raises(ConfigError, match=f"schema version {LATEST_VERSION + 1} is newer"):
        open_store(store_location)
