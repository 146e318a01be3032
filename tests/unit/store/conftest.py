"""Store fixtures: a store location per backend — a SQLite file in a temporary directory, and a
fresh database on the PostgreSQL server named by ATHANOR_TEST_POSTGRES_URL (skipped without it;
`scripts/start_postgres.sh` starts a throwaway one)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from postgres_db import postgres_database


@pytest.fixture(params=["sqlite", "postgresql"])
def store_location(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Where a fresh, empty store lives, for each backend."""
    if request.param == "sqlite":
        yield str(tmp_path)
    else:
        yield from postgres_database()
