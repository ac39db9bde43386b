"""The seeded service, started once per session (see `live`), and a PostgreSQL database for a
module's services."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import httpx
import pytest

from .live import Server, seed_database, start_server, stop_server

PG_ADMIN_URL = os.environ.get(
    "KERNELTUNE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("api")
    url = f"sqlite:///{tmp / 'kerneltune.db'}"
    seed_database(url)
    running = start_server(tmp, url)
    yield running
    stop_server(running)


@pytest.fixture
def client(server: Server) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


@pytest.fixture(scope="module")
def pg_module_url() -> Iterator[str]:
    """A fresh PostgreSQL database shared by one module's tests, dropped afterwards (the
    `pg_url` fixture makes one per test; a service started once per module needs one that
    lives as long). Skips where no server answers."""
    import psycopg

    admin = PG_ADMIN_URL.replace("postgresql+psycopg://", "postgresql://", 1)
    try:
        psycopg.connect(admin, connect_timeout=2).close()
    except psycopg.Error:
        pytest.skip(f"no PostgreSQL at {PG_ADMIN_URL}")
    name = f"kt_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
