"""A PostgreSQL store without psycopg installed: a one-line error naming the `postgres` extra."""

import sys

import pytest

from athanor.errors import ConfigError
from athanor.store import open_store


def test_postgres_without_psycopg_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # `import psycopg` now fails as if not installed
    with pytest.raises(ConfigError, match=r"pip install 'athanor\[postgres\]'") as info:
        open_store("postgresql://someone:secret@db.example/athanor")
    message = str(info.value)
    assert "\n" not in message and "db.example" in message and "secret" not in message
