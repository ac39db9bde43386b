from __future__ import annotations

import sqlite3
import threading
import time

import pytest
from sqlalchemy import create_engine, text

from kerneltune.storage import (
    ENV_DATABASE_URL,
    configure_sqlite,
    default_database_url,
    make_engine,
    normalize_url,
)


def test_default_url_is_sqlite_file_in_xdg_data_home(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_DATABASE_URL, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    url = default_database_url()
    assert url == f"sqlite:///{tmp_path / 'data' / 'kerneltune' / 'kerneltune.db'}"
    assert (tmp_path / "data" / "kerneltune").is_dir()


def test_default_url_falls_back_to_home_local_share(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_DATABASE_URL, raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_database_url() == (
        f"sqlite:///{tmp_path / '.local' / 'share' / 'kerneltune' / 'kerneltune.db'}"
    )


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
