"""Opening the database: SQLite (WAL, busy timeout, write transactions that lock up front) or
PostgreSQL (psycopg 3, the `postgres` extra), and retrying a write transaction that lost a lock race.

SQLite allows one writer at a time. A deferred transaction that reads and then writes can fail
at once with "database is locked" when another connection wrote in between, whatever the busy
timeout; starting every write transaction with BEGIN IMMEDIATE makes writers queue on the busy
timeout instead. Reads use a plain BEGIN and, in WAL mode, never wait for writers.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event, exc

from athanor.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_FILENAME = "athanor.db"
BUSY_TIMEOUT_S = 30.0
"""How long a SQLite writer waits for the lock before the retry loop takes over."""
RETRY_DEADLINE_S = 120.0
"""How long a write transaction is retried (lock races, PostgreSQL deadlocks) before it fails."""

T = TypeVar("T")


def database_url(location: str | Path, *, must_exist: bool = False) -> str:
    """The SQLAlchemy URL of a store location.

    `postgresql://...` (or `postgres://`, `postgresql+psycopg://`) selects PostgreSQL through
    psycopg 3; `sqlite:///...` is used as given; anything else is a path: a directory (the run
    directory) holds `athanor.db`, any other path is the database file itself. `must_exist`: a path
    must name an existing database file (a reader never creates one).
    """
    text = str(location)
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if text.startswith(prefix):
            return "postgresql+psycopg://" + text[len(prefix):]
    if text.startswith(("postgresql+", "postgres+")):
        raise ConfigError(f"store {text.split('@')[-1]}: only the psycopg driver is supported; "
                          "write the URL as postgresql://user@host/dbname")
    if text.startswith("sqlite:"):
        return text
    path = Path(text).expanduser()
    if path.is_dir():
        path = path / DEFAULT_FILENAME
    if not path.parent.is_dir():
        raise ConfigError(f"store {path}: the directory {path.parent} does not exist; create it first")
    if must_exist and not path.is_file():
        raise ConfigError(f"store {path}: no such file; give a run directory (it holds {DEFAULT_FILENAME}), a "
                          "store file or a postgresql:// URL")
    return f"sqlite:///{path.resolve()}"


def create_engine(url: str, *, read_only: bool = False) -> sa.Engine:
    """An engine for `url` (from `database_url`), configured for concurrent writers, or (`read_only`) for a
    reader the database itself refuses every write."""
    if url.startswith("sqlite"):
        if read_only:  # SQLite's own read-only mode, through a URI filename
            url = f"sqlite:///file:{sa.make_url(url).database}?mode=ro&uri=true"
        engine = sa.create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_S, "check_same_thread": False})
        _configure_sqlite(engine, read_only)
        return engine
    try:
        import psycopg  # noqa: F401
    except ModuleNotFoundError:
        where = sa.make_url(url).render_as_string(hide_password=True)
        raise ConfigError(f"store {where}: a PostgreSQL store needs the postgres extra: "
                          "pip install 'athanor[postgres]'") from None
    if read_only:  # every transaction of the session read-only: PostgreSQL refuses writes itself
        return sa.create_engine(url, pool_pre_ping=True,
                                connect_args={"options": "-c default_transaction_read_only=on"})
    return sa.create_engine(url, pool_pre_ping=True)


def _configure_sqlite(engine: sa.Engine, read_only: bool = False) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event (below) issue BEGIN, not the sqlite3 module.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        if not read_only:  # a reader takes the journal mode the writers set
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        # WAL + NORMAL is durable across process crashes (only an OS crash may lose the last commit).
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        write = not read_only and conn.get_execution_options().get("athanor_write", True)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def is_transient(error: exc.DBAPIError) -> bool:
    """Whether retrying the transaction may succeed: a lock race or a deadlock, not a bad query."""
    text = str(error.orig).lower()
    if "database is locked" in text or "database table is locked" in text or "busy" in text:
        return True
    sqlstate = getattr(error.orig, "sqlstate", None)
    return sqlstate in ("40001", "40P01")  # serialization failure, deadlock detected


def with_retries(work: Callable[[], T], *, what: str) -> T:
    """Run `work` (one whole transaction), again with jittered backoff while it fails transiently."""
    deadline = time.monotonic() + RETRY_DEADLINE_S
    delay = 0.01
    while True:
        try:
            return work()
        except exc.OperationalError as e:
            if not is_transient(e) or time.monotonic() > deadline:
                raise
            log.debug("store: %s hit a transient error (%s); retrying in %.3fs", what, e.orig, delay)
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 1.0)
