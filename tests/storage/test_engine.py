from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DataError, OperationalError, ProgrammingError

from kerneltune.storage import (
    ENV_DATABASE_URL,
    ErrorKind,
    StoreGoneError,
    UnsupportedDatabaseError,
    configure_sqlite,
    default_database_url,
    error_kind,
    make_engine,
    normalize_url,
    run_transaction,
    session_factory,
    sqlstate,
)


def test_default_url_is_sqlite_file_in_xdg_data_home(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_DATABASE_URL, raising=False)
    monkeypatch.delenv("KERNELTUNE_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    url = default_database_url()
    assert url == f"sqlite:///{tmp_path / 'data' / 'kerneltune' / 'kerneltune.db'}"
    assert (tmp_path / "data" / "kerneltune").is_dir()


def test_default_url_falls_back_to_home_local_share(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_DATABASE_URL, raising=False)
    monkeypatch.delenv("KERNELTUNE_DATA_DIR", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_database_url() == (
        f"sqlite:///{tmp_path / '.local' / 'share' / 'kerneltune' / 'kerneltune.db'}"
    )


def test_the_data_directory_setting_moves_the_default_store(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_DATABASE_URL, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("KERNELTUNE_DATA_DIR", str(tmp_path / "kt"))
    assert default_database_url() == f"sqlite:///{tmp_path / 'kt' / 'kerneltune.db'}"
    assert not (tmp_path / "xdg").exists()


def test_environment_variable_wins(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setenv(ENV_DATABASE_URL, "postgresql://u@db.example:5432/kt")
    assert default_database_url() == "postgresql://u@db.example:5432/kt"
    assert not (tmp_path / "kerneltune").exists()


@pytest.mark.parametrize(
    ("url", "driver"),
    [
        ("postgresql://u:secret@h/db", "postgresql+psycopg"),
        ("postgres://u:secret@h/db", "postgresql+psycopg"),
        ("postgresql+psycopg://u:secret@h/db", "postgresql+psycopg"),
        ("sqlite:///x.db", "sqlite"),
    ],
)
def test_urls_are_normalised_to_psycopg(url, driver):
    parsed = normalize_url(url)
    assert parsed.drivername == driver
    if driver != "sqlite":
        assert parsed.password == "secret" and parsed.database == "db"


def test_make_engine_uses_the_default_url(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_DATABASE_URL, raising=False)
    monkeypatch.delenv("KERNELTUNE_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    engine = make_engine()
    with engine.connect() as conn:
        conn.execute(text("CREATE TABLE t (x INTEGER)"))
        conn.commit()
    engine.dispose()
    assert (tmp_path / "kerneltune" / "kerneltune.db").is_file()


def test_sqlite_runs_in_wal_with_busy_timeout_and_foreign_keys(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'sub' / 'dir' / 'kt.db'}")  # parents created
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
    engine.dispose()


def test_switching_to_wal_waits_for_a_writer(tmp_path):
    """While another connection writes to a file still in rollback mode, SQLite refuses the
    switch to WAL at once, busy timeout or not: the connection retries until the writer is
    done, as processes opening a new store together need."""
    path = tmp_path / "kt.db"
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("CREATE TABLE t (x)")
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("INSERT INTO t VALUES (1)")
    done = threading.Timer(0.3, lambda: writer.execute("COMMIT"))
    done.start()
    engine = make_engine(f"sqlite:///{path}")
    started = time.monotonic()
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("SELECT count(*) FROM t").scalar() == 1
        assert time.monotonic() - started >= 0.2  # it did wait for the writer
    finally:
        done.join()
        writer.close()
        engine.dispose()


def test_an_engine_made_elsewhere_gets_the_same_settings(tmp_path):
    """Optuna makes its own engine on the store's file: configure_sqlite gives its
    connections, pooled ones included, what make_engine's have."""
    engine = create_engine(f"sqlite:///{tmp_path / 'kt.db'}")
    with engine.connect() as conn:  # pooled before the settings
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
    configure_sqlite(engine)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1
    engine.dispose()


@pytest.mark.postgres
def test_postgres_engine_goes_through_psycopg(pg_url):
    engine = make_engine(pg_url.replace("postgresql+psycopg://", "postgresql://"))
    assert engine.dialect.driver == "psycopg"
    assert engine.pool._pre_ping
    with engine.connect() as conn:
        assert conn.execute(text("SELECT 1")).scalar() == 1
    engine.dispose()


# --------------------------------------------------------------------------- what a store may do


def test_an_unsupported_database_is_refused_in_one_line():
    with pytest.raises(UnsupportedDatabaseError) as refused:
        make_engine("mysql://u:secret@db.example/kt")  # before any driver is imported
    message = str(refused.value)
    assert "unsupported database 'mysql'" in message and "\n" not in message
    assert "secret" not in message


def test_connecting_to_a_server_that_never_answers_gives_up(silent_server):
    engine = make_engine(f"postgresql://u@127.0.0.1:{silent_server}/kt", connect_timeout_s=2)
    started = time.monotonic()
    with pytest.raises(OperationalError) as failed:
        engine.connect()
    assert time.monotonic() - started < 5
    assert error_kind(failed.value) is ErrorKind.UNAVAILABLE
    engine.dispose()


@pytest.mark.postgres
def test_postgres_statement_timeout(pg_url):
    engine = make_engine(pg_url, statement_timeout_s=0.3)
    with engine.connect() as conn:
        assert conn.execute(text("SHOW statement_timeout")).scalar() == "300ms"
        started = time.monotonic()
        with pytest.raises(OperationalError) as cancelled:
            conn.execute(text("SELECT pg_sleep(5)"))
        assert time.monotonic() - started < 2
    assert sqlstate(cancelled.value) == "57014"
    assert error_kind(cancelled.value) is ErrorKind.UNAVAILABLE
    engine.dispose()
    # Without one (migrations, imports), none is set.
    engine = make_engine(pg_url)
    with engine.connect() as conn:
        assert conn.execute(text("SHOW statement_timeout")).scalar() == "0"
    engine.dispose()


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_an_sqlite_file_deleted_or_replaced_after_opening_is_never_used(tmp_path, how):
    """A connection would go on writing into the deleted file (gone at restart), and a new one
    would create an empty file in its place: both are refused."""
    path = tmp_path / "kt.db"
    engine = make_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (x INTEGER)"))
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    if how == "replaced":
        sqlite3.connect(path).close()
    for _ in range(2):  # the pooled connection, then a new one
        with pytest.raises(StoreGoneError), engine.begin() as conn:
            conn.execute(text("INSERT INTO t VALUES (1)"))
    assert path.exists() == (how == "replaced")  # nothing created in its place
    assert error_kind(StoreGoneError("x")) is ErrorKind.BROKEN
    engine.dispose()


@pytest.mark.postgres
def test_error_kinds_of_real_postgres_errors(pg_url):
    engine = make_engine(pg_url)
    with engine.connect() as conn:
        with pytest.raises(DataError) as nul:
            conn.execute(text("SELECT CAST(:v AS text)"), {"v": "a\x00b"})
        assert error_kind(nul.value) is ErrorKind.REFUSED  # never succeeds: no retry
        conn.rollback()
        with pytest.raises(ProgrammingError) as missing:
            conn.execute(text("SELECT * FROM results"))  # not migrated
        assert error_kind(missing.value) is ErrorKind.BROKEN
    engine.dispose()
    unreachable = make_engine("postgresql://u@127.0.0.1:1/kt")
    with pytest.raises(OperationalError) as refused:
        unreachable.connect()
    assert error_kind(refused.value) is ErrorKind.UNAVAILABLE
    unreachable.dispose()


@pytest.mark.postgres
def test_run_transaction_runs_again_a_transaction_aborted_by_a_deadlock(pg_url):
    """A transaction that locks row 1 then row 2 meets one that locks 2 then 1: PostgreSQL
    aborts one of them (here ours: the other waits 10 s before it looks for deadlocks), and
    `run_transaction` runs ours again, which then succeeds."""
    engine = make_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE pair (id INTEGER PRIMARY KEY, v INTEGER)"))
        conn.execute(text("INSERT INTO pair VALUES (1, 0), (2, 0)"))
    holds_first = threading.Event()
    attempts = []

    def other() -> None:
        with engine.connect() as conn:
            conn.execute(text("SET deadlock_timeout = '10s'"))
            conn.execute(text("UPDATE pair SET v = v + 10 WHERE id = 2"))
            holds_first.wait(10)
            time.sleep(0.2)  # ours now waits for row 2
            conn.execute(text("UPDATE pair SET v = v + 10 WHERE id = 1"))
            conn.commit()

    def ours(session) -> int:
        attempts.append(time.monotonic())
        session.execute(text("UPDATE pair SET v = v + 1 WHERE id = 1"))
        holds_first.set()
        session.execute(text("UPDATE pair SET v = v + 1 WHERE id = 2"))
        return len(attempts)

    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert run_transaction(session_factory(engine), ours) == 2
    finally:
        thread.join(30)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT v FROM pair ORDER BY id")).scalars().all() == [11, 11]
    engine.dispose()


@pytest.mark.postgres
def test_run_transaction_gives_up_after_its_attempts_and_never_retries_other_errors(pg_url):
    engine = make_engine(pg_url)
    calls = []

    def refused(session) -> None:
        calls.append(1)
        session.execute(text("SELECT CAST(:v AS text)"), {"v": "a\x00b"})

    with pytest.raises(DataError):
        run_transaction(session_factory(engine), refused)
    assert len(calls) == 1
    engine.dispose()
