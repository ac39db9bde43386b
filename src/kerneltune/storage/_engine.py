"""Engines and sessions: SQLite by default (WAL, busy timeout, foreign keys), PostgreSQL by URL."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session, sessionmaker

ENV_DATABASE_URL = "KERNELTUNE_DATABASE_URL"
#: How long an SQLite writer waits for another one before giving up ("database is locked").
SQLITE_BUSY_TIMEOUT_S = 30.0


def data_dir() -> Path:
    """The user's data directory for kerneltune ($XDG_DATA_HOME or ~/.local/share)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "kerneltune"


def default_database_url() -> str:
    """`KERNELTUNE_DATABASE_URL` if set, else an SQLite file in the user's data directory."""
    url = os.environ.get(ENV_DATABASE_URL, "").strip()
    if url:
        return url
    directory = data_dir()
    directory.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{directory / 'kerneltune.db'}"


def normalize_url(url: str | URL) -> URL:
    """Parse a database URL; plain `postgresql://` and `postgres://` go through psycopg 3."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def _enable_wal(cursor: Any) -> None:
    """Switch the file to WAL (readers never block the writer nor it them; it persists in the
    file), unless it is already. The switch needs the file to itself, and while another
    connection is writing SQLite refuses it at once ("database is locked") instead of waiting
    out the busy timeout, so it is retried until then: processes opening a new store together
    race for it."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while True:
        try:
            if str(cursor.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        _enable_wal(cursor)
        cursor.execute("PRAGMA synchronous = NORMAL")  # durable across crashes under WAL
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


def configure_sqlite(engine: Engine) -> Engine:
    """Give every connection of an SQLite `engine` made elsewhere (Optuna's) the settings above;
    connections it has pooled already are dropped, so that none goes without them. Under WAL,
    `synchronous = NORMAL` spares each commit its fsync: a tuning job commits several times a
    trial."""
    event.listen(engine, "connect", _sqlite_on_connect)
    engine.dispose()
    return engine


def make_engine(url: str | URL | None = None, **kwargs: Any) -> Engine:
    """An engine for `url` (default: `default_database_url()`), set up for concurrent workers.

    Extra keyword arguments go to `sqlalchemy.create_engine`.
    """
    parsed = normalize_url(url if url is not None else default_database_url())
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        database = parsed.database
        if database and database != ":memory:" and not database.startswith("file:"):
            # Where the folder cannot be made, SQLite's own "unable to open database file"
            # says so on the first connection.
            with contextlib.suppress(OSError):
                Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        connect_args = {"timeout": SQLITE_BUSY_TIMEOUT_S, **kwargs.pop("connect_args", {})}
        return configure_sqlite(create_engine(parsed, connect_args=connect_args, **kwargs))
    if backend == "postgresql":
        kwargs.setdefault("pool_pre_ping", True)
    return create_engine(parsed, **kwargs)


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions whose objects stay readable after commit (they are handed to other layers)."""
    return sessionmaker(engine, expire_on_commit=False)
