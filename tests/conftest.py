"""Shared fixtures. Without a GPU, Triton kernels run under its CPU interpreter."""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Iterator

import pytest

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover - torch is a hard dependency
    _HAS_CUDA = False
if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
# The runtime reads a local table from the data directory and records untuned keys in it, and
# tune, import and merge write there: never the user's own, whatever the test (`data_dir` gives
# each test a fresh one).
os.environ["KERNELTUNE_DATA_DIR"] = tempfile.mkdtemp(prefix="kerneltune-test-data-")
atexit.register(shutil.rmtree, os.environ["KERNELTUNE_DATA_DIR"], ignore_errors=True)

PG_ADMIN_URL = os.environ.get(
    "KERNELTUNE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


@pytest.fixture(autouse=True)
def data_dir(monkeypatch, tmp_path) -> str:
    """A data directory of the test's own (KERNELTUNE_DATA_DIR), for it and its subprocesses."""
    path = tmp_path / "kerneltune-data"
    monkeypatch.setenv("KERNELTUNE_DATA_DIR", str(path))
    return str(path)


@pytest.fixture(scope="session")
def device() -> str:
    return "cuda" if _HAS_CUDA else "cpu"


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    """A fresh SQLite file for one test."""
    return f"sqlite:///{tmp_path / 'kerneltune.db'}"


def _pg_available() -> bool:
    try:
        import psycopg
    except ImportError:
        return False
    try:
        with psycopg.connect(_libpq(PG_ADMIN_URL), connect_timeout=2):
            return True
    except psycopg.Error:
        return False


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


@pytest.fixture
def pg_admin() -> str:
    """The libpq URL of the database `pg_url` makes its databases from (for tests that act on
    those databases from outside)."""
    return _libpq(PG_ADMIN_URL)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards.

    Skips where no server answers; `.ci/run` makes sure one does and that these tests ran.
    """
    if not _pg_available():
        pytest.skip(f"no PostgreSQL at {PG_ADMIN_URL}")
    import psycopg

    name = f"kt_{uuid.uuid4().hex[:12]}"
    admin = _libpq(PG_ADMIN_URL)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')



@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # type: ignore[no-untyped-def]
    """Under KERNELTUNE_STRICT (CI), a skipped PostgreSQL or browser test fails the run."""
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and os.environ.get("KERNELTUNE_STRICT")):
        return
    markers = {m.name for m in item.iter_markers()}
    if {"postgres", "browser"} & markers or "pg_url" in getattr(item, "fixturenames", ()):
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid} was skipped, but CI requires it to run: {report.longrepr}"


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections (the kernel's backlog) and never says a word: a
    database server that hangs."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(128)
        yield s.getsockname()[1]
