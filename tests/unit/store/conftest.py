"""Store fixtures: a store location per backend — a SQLite file in a temporary directory, and a
fresh database on the PostgreSQL server named by ATHANOR_TEST_POSTGRES_URL (skipped without it;
`scripts/start_postgres.sh` starts a throwaway one)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

POSTGRES_ENV = "ATHANOR_TEST_POSTGRES_URL"


def _postgres_database() -> Iterator[str]:
    url = os.environ.get(POSTGRES_ENV, "")
    if not url:
        pytest.skip(f"PostgreSQL tests need a server: set {POSTGRES_ENV} "
                    "(e.g. export {POSTGRES_ENV}=$(scripts/start_postgres.sh))".replace("{POSTGRES_ENV}", POSTGRES_ENV))
    import psycopg

    name = f"athanor_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = url.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def store_location(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Where a fresh, empty store lives, for each backend."""
    if request.param == "sqlite":
        yield str(tmp_path)
    else:
        yield from _postgres_database()
