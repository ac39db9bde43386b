"""A service that holds, through real uvicorn processes on loopback: concurrent writers on
PostgreSQL, a deadlock run again, bodies capped after the token, a store that hangs or whose
file is deleted, settings refused at start, and tables served from their kept rendering."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import psycopg
import pytest

from kerneltune.storage import make_engine, session_factory, upsert_result

from .live import (
    GPU,
    KERNEL,
    TOKEN,
    Server,
    entry_json,
    fastest,
    loadgen,
    seed_database,
    seeded_entry,
    spawn_server,
    start_server,
    stop_server,
    wait_for_workers,
    wait_healthy,
    writer_bodies,
)

AUTH = {"Authorization": f"Bearer {TOKEN}"}
UVICORN = ("uvicorn", "kerneltune.api.app:create_app", "--factory")


def libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def post(client: httpx.Client, device: str, entries: list) -> httpx.Response:
    return client.post("/api/v1/results", headers=AUTH,
                       json={"device": device, "entries": [entry_json(e) for e in entries]})


# --------------------------------------------------------------------------- writers


@pytest.fixture(scope="module")
def pg_service(pg_module_url, tmp_path_factory) -> Iterator[Server]:
    """`kerneltune serve --workers 2` over a seeded PostgreSQL database."""
    tmp = tmp_path_factory.mktemp("pg-service")
    seed_database(pg_module_url)
    server = start_server(tmp, pg_module_url, log_level="info",
                          command=("kerneltune.api.cli", "--workers", "2"))
    try:
        wait_for_workers(server.log, 2)
        yield server
    finally:
        stop_server(server)


def stored_us(server: Server, device: str) -> dict[tuple[int, int], float]:
    with server.client() as client:
        r = client.get(f"/api/v1/tables/{quote(device)}")
    assert r.status_code == 200
    return {(e["n"], e["m"]): e["us"] for e in r.json()["entries"]}


@pytest.mark.postgres
def test_concurrent_multi_entry_writers_on_postgres(pg_service, tmp_path):
    """16 clients, each posting 2-4 shared keys per request in random orders, to two worker
    processes: every POST stored (no 5xx: the writers of a device queue on its lock instead
    of deadlocking), and each key holds the fastest time any of them sent."""
    device = "Writers GPU"
    bodies, sent = writer_bodies(device, clients=16, posts=10, seed=1)
    path = tmp_path / "bodies.json"
    path.write_text(json.dumps(bodies))
    result = loadgen(pg_service.url, "--mode", "writers", "--bodies-file", str(path),
                     "--token", TOKEN)
    assert result["statuses"] == {"200": 160}, result["first_errors"]
    assert stored_us(pg_service, device) == fastest(sent)


@pytest.mark.postgres
def test_a_post_aborted_by_a_deadlock_is_run_again(pg_service, pg_module_url):
    """The POST locks key 1 and waits for key 2, which another transaction holds while it
    waits for key 1: PostgreSQL aborts the POST's transaction (the other one looks for
    deadlocks only after 10 s), and the service runs it again: 200, both entries stored."""
    device = "Deadlock GPU"
    first, second = (1024, 256), (2048, 256)
    with pg_service.client() as client:
        assert post(client, device, [seeded_entry(*k, us=50.0) for k in (first, second)]
                    ).status_code == 200
    lock = ("SELECT r.id FROM results r JOIN devices d ON d.id = r.device_id "
            "WHERE d.name = %s AND r.n = %s AND r.m = %s FOR UPDATE")
    deadlocks = ("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
    answers: list[httpx.Response] = []

    def publish() -> None:
        with pg_service.client() as client:
            answers.append(post(client, device, [seeded_entry(*k, us=10.0)
                                                 for k in (first, second)]))

    with psycopg.connect(libpq(pg_module_url)) as other, \
            psycopg.connect(libpq(pg_module_url), autocommit=True) as watch:
        before = watch.execute(deadlocks).fetchone()[0]
        other.execute("SET deadlock_timeout = '10s'")
        other.execute(lock, (device, *second))
        thread = threading.Thread(target=publish)
        thread.start()
        deadline = time.monotonic() + 30
        while not watch.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                "current_database() AND wait_event_type = 'Lock'"
                                ).fetchone()[0]:
            assert time.monotonic() < deadline, "the POST never waited for the held row"
            time.sleep(0.05)
        other.execute(lock, (device, *first))  # the deadlock: the POST's transaction aborts
        other.commit()
        thread.join(60)
        after = watch.execute(deadlocks).fetchone()[0]
    assert after > before  # there was a deadlock...
    assert answers[0].status_code == 200, answers[0].text  # ...and the POST outlived it
    assert len(answers[0].json()["stored"]) == 2
    assert stored_us(pg_service, device) == {first: 10.0, second: 10.0}


# --------------------------------------------------------------------------- bodies


def high_water_mark_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_an_unauthenticated_40_mb_post_is_refused_at_once(server):
    """The token is checked before a byte of the body is read: the 401 comes while the client
    is still sending, `/healthz` answers meanwhile, and the server never holds the body."""
    before = high_water_mark_kb(server.process.pid)
    result = loadgen(server.url, "--mode", "big-post", "--size", str(40_000_000))
    assert result["status"] == 401 and "bearer token" in result["answer"]
    assert result["answered_s"] < 1.0
    assert result["healthz_during"]["max_ms"] < 500
    assert high_water_mark_kb(server.process.pid) - before < 20_000
    with server.client() as client:  # the connection's leftovers never became a request
        assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize("chunked", [False, True])
def test_an_oversize_body_with_the_token_is_413(server, chunked):
    """Past KERNELTUNE_MAX_BODY_BYTES (8 MiB by default) a body is refused: at once when its
    Content-Length says so, as soon as the count passes the cap when it is sent in chunks."""
    result = loadgen(server.url, "--mode", "big-post", "--size", str(40_000_000),
                     "--token", TOKEN, *(["--chunked"] if chunked else []))
    assert result["status"] == 413 and "KERNELTUNE_MAX_BODY_BYTES" in result["answer"]
    assert result["answered_s"] < 2.0
    assert result["healthz_during"]["max_ms"] < 500
    if not chunked:
        assert result["sent_bytes_at_answer"] < 40_000_000


def test_an_unauthenticated_chunked_post_is_refused_at_once(server):
    result = loadgen(server.url, "--mode", "big-post", "--size", str(20_000_000), "--chunked")
    assert result["status"] == 401 and result["answered_s"] < 1.0


def test_a_small_cap_is_a_setting(tmp_path):
    url = f"sqlite:///{tmp_path / 'kerneltune.db'}"
    seed_database(url)
    server = start_server(tmp_path, url, extra_env={"KERNELTUNE_MAX_BODY_BYTES": "2048"})
    try:
        with server.client() as client:
            small = post(client, "Cap GPU", [seeded_entry(4096, 64)])
            assert small.status_code == 200
            big = post(client, "Cap GPU", [seeded_entry(n, 64) for n in (1024, 2048, 4096,
                                                                         8192, 512, 256)])
            assert big.status_code == 413
    finally:
        stop_server(server)


def test_a_trickled_body_gets_408_at_the_deadline(tmp_path):
    """A client that sends its body a byte at a time is answered 408 once
    KERNELTUNE_BODY_TIMEOUT_S has passed, whatever it still sends; others are served meanwhile."""
    url = f"sqlite:///{tmp_path / 'kerneltune.db'}"
    seed_database(url)
    server = start_server(tmp_path, url, extra_env={"KERNELTUNE_BODY_TIMEOUT_S": "1"})
    host, port = server.url.removeprefix("http://").split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=10) as sock, \
                server.client() as client:
            sock.sendall(f"POST /api/v1/results HTTP/1.1\r\nHost: {host}\r\n"
                         f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
                         "Content-Length: 1000\r\n\r\n".encode())
            started = time.monotonic()
            sock.setblocking(False)
            answer = b""
            while not answer and time.monotonic() - started < 5:
                try:
                    sock.send(b" ")
                    answer = sock.recv(4096)
                except BlockingIOError:
                    pass
                t = time.monotonic()
                assert client.get("/healthz").status_code == 200
                assert time.monotonic() - t < 0.3
                time.sleep(0.2)
            took = time.monotonic() - started
            assert answer.startswith(b"HTTP/1.1 408"), answer
            assert b"KERNELTUNE_BODY_TIMEOUT_S" in answer
            assert 0.9 < took < 2.0
            assert post(client, "Trickle GPU", [seeded_entry(4096, 64)]).status_code == 200
    finally:
        stop_server(server)


# --------------------------------------------------------------------------- a store that hangs


def test_a_hung_store_gets_503_within_deadlines_and_never_stalls_the_service(
        tmp_path, silent_server):
    server = wait_healthy(spawn_server(
        tmp_path, f"postgresql+psycopg://u@127.0.0.1:{silent_server}/kt", command=UVICORN,
        extra_env={"KERNELTUNE_DATABASE_CONNECT_TIMEOUT_S": "3"}))
    try:
        with server.client() as client:
            started = time.monotonic()
            r = client.get("/readyz")
            took = time.monotonic() - started
            assert r.status_code == 503 and "did not answer within 2 s" in r.json()["detail"]
            assert 1.5 < took < 3.0

            answers: dict[str, tuple[httpx.Response, float]] = {}

            def ask(path: str) -> None:
                with server.client() as c:
                    t = time.monotonic()
                    answers[path] = (c.get(path), time.monotonic() - t)

            paths = [f"/api/v1/configs/{KERNEL}?gpu=x&n=4096&m=64", "/api/v1/gpus",
                     "/api/v1/tables/x"]
            threads = [threading.Thread(target=ask, args=(p,)) for p in paths]
            for t in threads:
                t.start()
            time.sleep(0.3)  # all three now wait on the store
            for _ in range(10):
                t = time.monotonic()
                assert client.get("/healthz").status_code == 200
                assert time.monotonic() - t < 0.3
            for t in threads:
                t.join(30)
        for path in paths:
            r, took = answers[path]
            assert r.status_code == 503, (path, r.text)
            assert r.headers["retry-after"] == "5"  # it may come back
            assert took < 6.0, path
    finally:
        stop_server(server)


@pytest.mark.postgres
def test_a_store_frozen_mid_statement_holds_lookups_not_the_service(tmp_path, pg_url):
    """Every statement waits on a lock held elsewhere (a PostgreSQL frozen after connecting):
    lookups wait in worker threads, `/healthz` keeps answering, and they all finish once the
    lock goes."""
    seed_database(pg_url)
    server = start_server(tmp_path, pg_url, command=UVICORN)  # one worker: one event loop
    lookup = f"/api/v1/configs/{KERNEL}?gpu={quote(GPU)}&n=4096&m=64"
    try:
        with server.client() as client, psycopg.connect(libpq(pg_url)) as lock:
            assert client.get(lookup).status_code == 200  # pooled connection, names cached
            lock.execute("LOCK TABLE results IN ACCESS EXCLUSIVE MODE")
            answers: list[int] = []

            def ask() -> None:
                with server.client() as c:
                    answers.append(c.get(lookup).status_code)

            threads = [threading.Thread(target=ask) for _ in range(4)]
            for t in threads:
                t.start()
            time.sleep(0.5)  # all four now wait on the lock
            assert answers == []
            for _ in range(10):
                t = time.monotonic()
                assert client.get("/healthz").status_code == 200
                assert time.monotonic() - t < 0.3
            lock.rollback()
            for t in threads:
                t.join(30)
        assert answers == [200] * 4
    finally:
        stop_server(server)


# --------------------------------------------------------------------------- a deleted store


def test_a_deleted_sqlite_store_is_not_ready_and_stores_nothing(tmp_path):
    path = tmp_path / "kerneltune.db"
    url = f"sqlite:///{path}"
    seed_database(url)
    server = start_server(tmp_path, url)
    try:
        with server.client() as client:
            assert client.get("/readyz").status_code == 200
            assert post(client, "Before GPU", [seeded_entry(4096, 64)]).status_code == 200
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            r = client.get("/readyz")
            assert r.status_code == 503 and "deleted" in r.json()["detail"]
            r = post(client, "After GPU", [seeded_entry(4096, 64)])
            assert r.status_code == 503 and "stored" not in r.text
            assert "retry-after" not in r.headers  # it never comes back by itself
            lookup = client.get(f"/api/v1/configs/{KERNEL}",
                                params={"gpu": GPU, "n": 4096, "m": 64})
            assert lookup.status_code == 503
            assert client.get("/healthz").status_code == 200
        assert not path.exists()  # no empty store was made in its place
    finally:
        stop_server(server)


# --------------------------------------------------------------------------- refused at start


def serve(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KERNELTUNE_")}
    return subprocess.run([sys.executable, "-m", "kerneltune.cli", "serve", *args],
                          capture_output=True, text=True, timeout=120, env={**clean, **env})


def test_a_short_write_token_is_refused_at_start(tmp_path):
    r = serve("--database-url", f"sqlite:///{tmp_path / 'kt.db'}", "--port", "1",
              KERNELTUNE_WRITE_TOKEN="a" * 15)
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr
    assert "KERNELTUNE_WRITE_TOKEN" in r.stderr and "16" in r.stderr
    assert "a" * 15 not in r.stderr
    assert not (tmp_path / "kt.db").exists()  # refused before the store was touched


def test_the_log_level_is_a_setting(tmp_path):
    """KERNELTUNE_LOG_LEVEL sets uvicorn's level and the service's: at `warning`, neither
    uvicorn's start lines nor the service's conflict notes are logged."""
    url = f"sqlite:///{tmp_path / 'kerneltune.db'}"
    server = start_server(tmp_path, url, log_level=None,
                          extra_env={"KERNELTUNE_LOG_LEVEL": "WARNING"})
    try:
        with server.client() as client:
            assert client.get("/api/v1/gpus").status_code == 200
    finally:
        stop_server(server)
    log = server.log.read_text()
    assert "Uvicorn running on" not in log and "INFO" not in log, log
    refused = serve("--database-url", url, "--port", "1", KERNELTUNE_LOG_LEVEL="chatty")
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    assert "KERNELTUNE_LOG_LEVEL" in refused.stderr


@pytest.mark.parametrize("url", ["mysql://u:secret@db.example/kt", "oracle://u@h/db"])
def test_an_unsupported_database_url_is_one_line(url):
    r = serve("--database-url", url)
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr
    assert "unsupported database" in r.stderr and "secret" not in r.stderr


# --------------------------------------------------------------------------- tables


def test_tables_are_gzipped_on_request_and_304_for_either_tag(client):
    url = f"/api/v1/tables/{quote(GPU)}"
    plain = client.get(url, headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers
    with client.stream("GET", url, headers={"Accept-Encoding": "gzip"}) as zipped:
        compressed = b"".join(zipped.iter_raw())
    assert zipped.headers["content-encoding"] == "gzip"
    assert gzip.decompress(compressed) == plain.content
    assert len(compressed) < len(plain.content) / 3
    assert zipped.headers["vary"] == plain.headers["vary"] == "Accept-Encoding"
    tags = (plain.headers["etag"], zipped.headers["etag"])
    assert tags[0] != tags[1]
    for encoding in ("identity", "gzip"):
        for tag in tags:
            r = client.get(url, headers={"If-None-Match": tag, "Accept-Encoding": encoding})
            assert r.status_code == 304


def test_other_answers_are_gzipped_on_request(client):
    r = client.get("/api/v1/kernels", headers={"Accept-Encoding": "gzip"})
    assert r.status_code == 200 and r.headers["content-encoding"] == "gzip"
    r = client.get("/api/v1/kernels", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in r.headers


def test_the_table_tag_is_kept_until_a_write_from_any_process(tmp_path, monkeypatch):
    """The fingerprint and the rendered table are computed once per version of the device's
    rows: repeated 200s and 304s read one cheap statement; a write by another process (here,
    straight into the store) is seen by the next request."""
    from fastapi.testclient import TestClient

    import kerneltune.api.devices as devices
    from kerneltune.api import Settings, create_app

    url = f"sqlite:///{tmp_path / 'kerneltune.db'}"
    seed_database(url)
    calls = []
    real = devices.table_etag
    monkeypatch.setattr(devices, "table_etag", lambda *a: calls.append(1) or real(*a))
    app = create_app(Settings(_env_file=None, database_url=url))
    table = f"/api/v1/tables/{quote(GPU)}"
    with TestClient(app) as client:
        etag = client.get(table).headers["etag"]
        assert len(calls) == 1
        for _ in range(5):
            assert client.get(table, headers={"If-None-Match": etag}).status_code == 304
            assert client.get(table).headers["etag"] == etag
        assert len(calls) == 1
        engine = make_engine(url)
        with session_factory(engine).begin() as session:
            upsert_result(session, GPU, seeded_entry(4096, 64, us=0.5))
        engine.dispose()
        r = client.get(table, headers={"If-None-Match": etag})
        assert r.status_code == 200 and r.headers["etag"] != etag
        assert len(calls) == 2
        assert any(e["us"] == 0.5 for e in r.json()["entries"])
