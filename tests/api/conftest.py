"""The seeded service, started once per session (see `live`)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from .live import Server, seed_database, start_server, stop_server


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
