"""A fresh database on the PostgreSQL server that ATHANOR_TEST_POSTGRES_URL names, for the tests of the store and
of whatever shares one (`scripts/start_postgres.sh` starts a throwaway server)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

POSTGRES_ENV = "ATHANOR_TEST_POSTGRES_URL"


def postgres_database() -> Iterator[str]:
    """The URL of a database created for the caller and dropped after it; a skip naming the variable without a server."""
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
