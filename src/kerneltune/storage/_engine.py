"""Engines and sessions: SQLite by default (WAL, busy timeout, foreign keys), PostgreSQL by URL
(connect timeout, optional statement timeout); what a store error means for the one who asked
(`error_kind`), and transactions retried when the database aborted them for a conflict
(`run_transaction`)."""

from __future__ import annotations

import contextlib
import enum
import math
import os
import random
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event, exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session, sessionmaker

T = TypeVar("T")

ENV_DATABASE_URL = "KERNELTUNE_DATABASE_URL"
#: How long an SQLite writer waits for another one before giving up ("database is locked").
SQLITE_BUSY_TIMEOUT_S = 30.0
#: How long opening a PostgreSQL connection may take (libpq waits forever by default), and how
#: long a caller waits for a free pooled connection.
CONNECT_TIMEOUT_S = 10.0
#: The databases the store runs on (SQLAlchemy backend names).
SUPPORTED_BACKENDS = ("sqlite", "postgresql")
#: How often a transaction aborted by a conflict is run in all (PostgreSQL's deadlock detector
#: and serialization checks abort one of the parties; running it again then succeeds).
TRANSACTION_ATTEMPTS = 4
#: SQLSTATEs of those aborts: deadlock_detected, serialization_failure.
CONFLICT_SQLSTATES = frozenset({"40P01", "40001"})


class UnsupportedDatabaseError(exc.ArgumentError):
    """A URL naming a database the store does not run on (only SQLite and PostgreSQL)."""


class StoreGoneError(exc.SQLAlchemyError):
    """The SQLite file an engine opened was deleted or replaced since: whatever is written now
    goes to a file no one will open again, so nothing is (restart on the file that is there)."""


#: The one setting that moves kerneltune's data: the default store, the machine's own tables
#: and the record of untuned keys (`kerneltune.runtime.local.data_dir`, which storage may not
#: import, reads the same).
ENV_DATA_DIR = "KERNELTUNE_DATA_DIR"


def data_dir() -> Path:
    """The user's data directory for kerneltune: `KERNELTUNE_DATA_DIR`, else
    `$XDG_DATA_HOME/kerneltune`, else `~/.local/share/kerneltune`."""
    own = os.environ.get(ENV_DATA_DIR, "").strip()
    if own:
        return Path(own).expanduser()
    base = os.environ.get("XDG_DATA_HOME", "").strip() or Path.home() / ".local" / "share"
    return Path(base).expanduser() / "kerneltune"


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


def supported_url(url: str | URL) -> URL:
    """`normalize_url(url)`, refused with `UnsupportedDatabaseError` (one line, before any
    driver is imported) unless it names SQLite or PostgreSQL."""
    parsed = normalize_url(url)
    backend = parsed.get_backend_name()
    if backend not in SUPPORTED_BACKENDS:
        raise UnsupportedDatabaseError(
            f"unsupported database {backend!r}: the store runs on SQLite (sqlite:///PATH) or "
            "PostgreSQL (postgresql://USER@HOST/DB)"
        )
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


def make_engine(
    url: str | URL | None = None,
    *,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    statement_timeout_s: float | None = None,
    **kwargs: Any,
) -> Engine:
    """An engine for `url` (default: `default_database_url()`), set up for concurrent workers.

    On PostgreSQL, connecting and waiting for a pooled connection each give up after
    `connect_timeout_s`, and with `statement_timeout_s` the server cancels longer statements
    (lock waits included): a service sets it, a migration or a bulk import need not. An SQLite
    file is watched: once it is deleted or replaced, every use raises `StoreGoneError`. A URL of
    another database raises `UnsupportedDatabaseError`. Extra keyword arguments go to
    `sqlalchemy.create_engine`.
    """
    parsed = supported_url(url if url is not None else default_database_url())
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database
        on_disk = bool(database) and database != ":memory:" and not database.startswith("file:")
        if on_disk:
            # Where the folder cannot be made, SQLite's own "unable to open database file"
            # says so on the first connection.
            with contextlib.suppress(OSError):
                Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        connect_args = {"timeout": SQLITE_BUSY_TIMEOUT_S, **kwargs.pop("connect_args", {})}
        engine = configure_sqlite(create_engine(parsed, connect_args=connect_args, **kwargs))
        if on_disk:
            _StoreFile(Path(database).expanduser().absolute()).watch(engine)
        return engine
    connect_args = {"connect_timeout": max(1, math.ceil(connect_timeout_s))}
    if statement_timeout_s is not None:
        ms = max(1, round(statement_timeout_s * 1000))
        given = parsed.query.get("options")
        options = " ".join([*([given] if isinstance(given, str) else given or []),
                            f"-c statement_timeout={ms}"])
        connect_args["options"] = options
    connect_args.update(kwargs.pop("connect_args", {}))
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("pool_timeout", connect_timeout_s)
    return create_engine(parsed, connect_args=connect_args, **kwargs)


class _StoreFile:
    """The identity (device, inode) of an engine's SQLite file when it first opened it, checked
    at every checkout and before every new connection. A connection keeps reading and writing a
    deleted file, and a new one would create an empty file in its place; either would answer
    from or store into a store that is gone."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.identity: tuple[int, int] | None = None

    def current(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def check(self, *_: Any) -> None:
        if self.identity is not None and self.current() != self.identity:
            raise StoreGoneError(
                f"the store's file {self.path} was deleted or replaced since it was opened"
            )

    def remember(self, *_: Any) -> None:
        if self.identity is None:
            self.identity = self.current()

    def watch(self, engine: Engine) -> None:
        event.listen(engine, "do_connect", self.check)  # before SQLite would create the file
        event.listen(engine, "connect", self.remember)
        event.listen(engine, "checkout", self.check)


# --------------------------------------------------------------------------- errors


class ErrorKind(enum.Enum):
    """What a store error means for the request that met it."""

    #: The database aborted the transaction for a conflict with another one: run it again.
    CONFLICT = "conflict"
    #: The database cannot be reached or is overloaded now; the same request may succeed later.
    UNAVAILABLE = "unavailable"
    #: The database refused a value of the request (a NUL byte, a number out of range): the
    #: same request never succeeds.
    REFUSED = "refused"
    #: The store cannot serve until someone acts (not migrated, its file gone).
    BROKEN = "broken"


_UNAVAILABLE_SQLSTATE_CLASSES = ("08", "53", "57", "55")  # connection, resources, operator, lock


def sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of a PostgreSQL error (psycopg's), or of the driver error it wraps."""
    orig = getattr(error, "orig", None)
    code = getattr(orig, "sqlstate", None) or getattr(error, "sqlstate", None)
    return code if isinstance(code, str) else None


def error_kind(error: BaseException) -> ErrorKind:
    """Whether a store error is a conflict to retry, a passing unavailability, a value the
    database will never take, or a store that is broken until someone acts."""
    if isinstance(error, StoreGoneError):
        return ErrorKind.BROKEN
    code = sqlstate(error)
    if code in CONFLICT_SQLSTATES:
        return ErrorKind.CONFLICT
    if code is not None:
        if code.startswith(("22", "23")):  # data exception, integrity constraint violation
            return ErrorKind.REFUSED
        if code.startswith(_UNAVAILABLE_SQLSTATE_CLASSES):
            return ErrorKind.UNAVAILABLE
        return ErrorKind.BROKEN  # undefined table (not migrated), permissions, ...
    if isinstance(error, exc.DataError | exc.IntegrityError):
        return ErrorKind.REFUSED
    if isinstance(error, exc.OperationalError):
        text = str(getattr(error, "orig", error)).lower()
        if "no such table" in text or "no such column" in text:  # SQLite, not migrated
            return ErrorKind.BROKEN
        return ErrorKind.UNAVAILABLE  # unreachable, locked, timed out
    if isinstance(error, exc.InterfaceError | exc.TimeoutError | exc.DisconnectionError):
        return ErrorKind.UNAVAILABLE
    return ErrorKind.BROKEN


def retry_delay_s(attempt: int, base_s: float = 0.05) -> float:
    """The pause before attempt `attempt + 1`: exponential, jittered so that the parties of a
    conflict do not meet again in step."""
    return base_s * 2 ** (attempt - 1) * random.uniform(0.5, 1.5)


def run_transaction(
    sessions: sessionmaker[Session],
    work: Callable[[Session], T],
    *,
    attempts: int = TRANSACTION_ATTEMPTS,
) -> T:
    """`work(session)` in a transaction of its own, committed; run again from the start (a few
    times, after a jittered pause) when the database aborted it for a deadlock or a
    serialization failure, so a writer racing others in a different order still succeeds.
    `work` must do nothing outside the transaction that cannot be repeated."""
    for attempt in range(1, attempts + 1):
        try:
            with sessions.begin() as session:
                return work(session)
        except exc.DBAPIError as e:
            if error_kind(e) is not ErrorKind.CONFLICT or attempt == attempts:
                raise
        time.sleep(retry_delay_s(attempt))
    raise AssertionError("unreachable")


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions whose objects stay readable after commit (they are handed to other layers)."""
    return sessionmaker(engine, expire_on_commit=False)
