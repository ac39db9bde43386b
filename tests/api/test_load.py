"""Load on loopback, from a separate load-generator process (`loadgen.py`).

`test_lookup_rate`: config lookups against `kerneltune serve` over a seeded SQLite store for
20 s: at least 500 lookups/s with no error (benchmarks/results/api/loadtest.json). One worker
process: on two cores the other core runs the load generator. (With uvicorn's multi-process
mode, every answer took a fixed ~45 ms more here, whatever the concurrency.)

`test_reliability_figures`: what a client sees when the service is pushed
(benchmarks/results/api/reliability.json): 16 writers x 25 multi-entry POSTs on PostgreSQL to
two worker processes (errors, lost updates, posts/s), lookups and tables (200 and 304) at 32
connections, an unauthenticated 40 MB POST (its answer, how long it took, `/healthz`
meanwhile) and a store that hangs (`/readyz` and a lookup: answer and time).

The rates and latencies are printed (pytest -s); the committed records are rewritten only with
KERNELTUNE_RECORD_LOADTEST=1, so a test run leaves the tree clean:

    KERNELTUNE_RECORD_LOADTEST=1 TRITON_INTERPRET=1 .venv/bin/python -m pytest \
        tests/api/test_load.py -s

KERNELTUNE_LOADTEST_SECONDS, _CONCURRENCY and _WORKERS change the lookup run (e.g. for a bigger
host); KERNELTUNE_RELIABILITY_SECONDS each rate phase of the figures (default 20 s when
recording, 4 s otherwise).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from kerneltune.table import device_slug

from .live import (
    GPU,
    KERNEL,
    OTHER_GPU,
    TOKEN,
    Server,
    fastest,
    loadgen,
    seed_database,
    spawn_server,
    start_server,
    stop_server,
    wait_for_workers,
    wait_healthy,
    writer_bodies,
)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "benchmarks" / "results" / "api" / "loadtest.json"
RELIABILITY = RESULT.with_name("reliability.json")
RECORDING = bool(os.environ.get("KERNELTUNE_RECORD_LOADTEST"))
DURATION_S = float(os.environ.get("KERNELTUNE_LOADTEST_SECONDS", "20"))
CONCURRENCY = int(os.environ.get("KERNELTUNE_LOADTEST_CONCURRENCY", "8"))
WORKERS = int(os.environ.get("KERNELTUNE_LOADTEST_WORKERS", "1"))
MIN_RATE = 500.0


def lookup_paths() -> list[str]:
    """Exact, nearest and default answers, both GPU spellings, several dtypes."""
    paths = []
    for gpu in (GPU, device_slug(GPU), OTHER_GPU):
        for n in (1024, 2048, 3072, 4096, 5000, 8192):
            for m in (1, 37, 64, 100, 4096, 5000):
                for dtype in ("bfloat16", "float16"):
                    paths.append(f"/api/v1/configs/{KERNEL}?gpu={quote(gpu)}&n={n}&m={m}"
                                 f"&dtype={dtype}")
    return paths


def test_lookup_rate(tmp_path):
    url = f"sqlite:///{tmp_path / 'kerneltune.db'}"
    seed_database(url)
    paths_file = tmp_path / "paths.txt"
    paths_file.write_text("\n".join(lookup_paths()))
    server = start_server(tmp_path, url, command=("kerneltune.api.cli", "--workers", str(WORKERS)),
                          log_level="info" if WORKERS > 1 else "warning")
    try:
        if WORKERS > 1:
            wait_for_workers(server.log, WORKERS)
        run = subprocess.run(
            [sys.executable, str(Path(__file__).with_name("loadgen.py")), server.url,
             "--paths-file", str(paths_file), "--duration", str(DURATION_S),
             "--concurrency", str(CONCURRENCY)],
            capture_output=True, text=True, timeout=DURATION_S + 120, check=True,
        )
    finally:
        stop_server(server)
    result = json.loads(run.stdout)
    result.update({
        "what": "GET /api/v1/configs lookups (exact, nearest and default answers) over loopback",
        "server": f"kerneltune serve --workers {WORKERS}, SQLite store",
        "distinct_paths": len(lookup_paths()),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    })
    # The committed record is rewritten only on request, so a test run leaves the tree clean.
    record = RESULT if RECORDING else tmp_path / RESULT.name
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"\nlookups: {result['rate_per_s']:.0f}/s over {result['seconds']:.1f} s, "
          f"p50 {result['p50_ms']:.2f} ms, p99 {result['p99_ms']:.2f} ms, "
          f"errors {result['errors']} (concurrency {CONCURRENCY}, {WORKERS} workers)")
    assert result["errors"] == 0, result["first_errors"]
    assert result["rate_per_s"] >= MIN_RATE


# --------------------------------------------------------------------------- reliability

PHASE_S = float(os.environ.get("KERNELTUNE_RELIABILITY_SECONDS", "20" if RECORDING else "4"))
FIGURE_CONNECTIONS = 32
WRITERS, POSTS_PER_WRITER = 16, 25
SHIPPED_GPU = "NVIDIA H100 80GB HBM3"


def rate(server: Server, paths: list[str], tmp: Path, *headers: str, expect: int = 200) -> dict:
    paths_file = tmp / f"paths-{time.monotonic_ns()}.txt"
    paths_file.write_text("\n".join(paths))
    extra = [a for h in headers for a in ("--header", h)]
    result = loadgen(server.url, "--paths-file", str(paths_file), "--duration", str(PHASE_S),
                     "--concurrency", str(FIGURE_CONNECTIONS), "--expect", str(expect), *extra)
    assert result["errors"] == 0, result["first_errors"]
    return {k: result[k] for k in ("requests", "rate_per_s", "p50_ms", "p99_ms", "max_ms",
                                   "errors", "concurrency")}


def lookups(server: Server, tmp: Path) -> dict:
    return rate(server, lookup_paths(), tmp)


def tables(server: Server, tmp: Path, gpu: str) -> dict:
    path = f"/api/v1/tables/{quote(gpu)}"
    with server.client() as client:
        r = client.get(path, headers={"Accept-Encoding": "identity"})
    etag = r.headers["etag"]
    return {
        "gpu": gpu, "entries": len(r.json()["entries"]), "body_bytes": len(r.content),
        "200": rate(server, [path], tmp),
        "304": rate(server, [path], tmp, f"If-None-Match: {etag}", expect=304),
    }


def high_water_mark_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(ln for ln in status.splitlines() if ln.startswith("VmHWM:")).split()[1])


@contextlib.contextmanager
def silent_port() -> Iterator[int]:
    """A TCP port that accepts connections and never says a word: a database that hangs."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(128)
        yield s.getsockname()[1]


def hung_store(tmp: Path) -> dict:
    """`/readyz` and a lookup against a PostgreSQL URL whose server accepts and never answers,
    with `/healthz` asked meanwhile; the service's default timeouts."""
    with silent_port() as port:
        server = wait_healthy(spawn_server(
            tmp, f"postgresql+psycopg://u@127.0.0.1:{port}/kt",
            command=("uvicorn", "kerneltune.api.app:create_app", "--factory")))
        try:
            with server.client() as client:
                t = time.monotonic()
                ready = client.get("/readyz")
                ready_s = time.monotonic() - t
                lookup_path = f"/api/v1/configs/{KERNEL}?gpu={quote(GPU)}&n=4096&m=64"
                with httpx.Client(base_url=server.url, timeout=60) as other:
                    t = time.monotonic()
                    pending = subprocess.Popen(  # the lookup from its own process
                        [sys.executable, "-c", "import httpx, sys, time; t = time.monotonic(); "
                         f"r = httpx.get({server.url + lookup_path!r}, timeout=60); "
                         "print(r.status_code, r.headers.get('retry-after'), "
                         "round(time.monotonic() - t, 3), r.json()['detail'])"],
                        stdout=subprocess.PIPE, text=True)
                    health = []
                    while pending.poll() is None:
                        h = time.monotonic()
                        assert other.get("/healthz").status_code == 200
                        health.append(1e3 * (time.monotonic() - h))
                        time.sleep(0.05)
                    status, retry_after, lookup_s, detail = pending.stdout.read().split(" ", 3)
        finally:
            stop_server(server)
    return {
        "store": "postgresql URL of a TCP listener that accepts and never answers",
        "readyz": {"status": ready.status_code, "seconds": round(ready_s, 3),
                   "detail": ready.json()["detail"]},
        "lookup": {"status": int(status), "retry_after": retry_after,
                   "seconds": float(lookup_s), "detail": detail.strip()},
        "healthz_during_lookup": {"requests": len(health),
                                  "max_ms": round(max(health), 3),
                                  "p50_ms": round(sorted(health)[len(health) // 2], 3)},
    }


@pytest.mark.postgres
def test_reliability_figures(tmp_path, pg_url):
    import psycopg

    figures: dict = {}
    # Writers and lookups on PostgreSQL, two worker processes.
    seed_database(pg_url)
    (tmp_path / "pg").mkdir()
    server = start_server(tmp_path / "pg", pg_url, log_level="info",
                          command=("kerneltune.api.cli", "--workers", "2"))
    try:
        wait_for_workers(server.log, 2)
        bodies_file = tmp_path / "bodies.json"
        # The first posts of fresh worker processes, apart: they pay for warming up.
        bodies, _ = writer_bodies("Warm-up GPU", WRITERS, 2, seed=6)
        bodies_file.write_text(json.dumps(bodies))
        first = loadgen(server.url, "--mode", "writers", "--bodies-file", str(bodies_file),
                        "--token", TOKEN)
        figures["writers_postgres_first_posts"] = first
        device = "Writers GPU"
        bodies, sent = writer_bodies(device, WRITERS, POSTS_PER_WRITER, seed=7)
        bodies_file.write_text(json.dumps(bodies))
        writers = loadgen(server.url, "--mode", "writers", "--bodies-file", str(bodies_file),
                          "--token", TOKEN)
        with server.client() as client:
            table = client.get(f"/api/v1/tables/{quote(device)}").json()
        stored = {(e["n"], e["m"]): e["us"] for e in table["entries"]}
        expected = fastest(sent)
        writers["keys"] = len(expected)
        writers["lost_updates"] = sum(stored.get(k) != us for k, us in expected.items())
        figures["writers_postgres"] = writers
        figures["lookups_postgres"] = lookups(server, tmp_path)
    finally:
        stop_server(server)
    with psycopg.connect(pg_url.replace("+psycopg", "")) as conn:
        postgres = conn.execute("SHOW server_version").fetchone()[0]

    # Lookups, tables and a huge unauthenticated POST on the default store: SQLite, one worker.
    url = f"sqlite:///{tmp_path / 'kerneltune.db'}"
    seed_database(url)
    (tmp_path / "sqlite").mkdir()
    server = start_server(tmp_path / "sqlite", url)
    try:
        figures["lookups_sqlite"] = lookups(server, tmp_path)
        figures["tables_sqlite"] = [tables(server, tmp_path, GPU),
                                    tables(server, tmp_path, SHIPPED_GPU)]
        before = high_water_mark_kb(server.process.pid)
        big = loadgen(server.url, "--mode", "big-post", "--size", str(40_000_000))
        big["server_peak_memory_growth_kb"] = high_water_mark_kb(server.process.pid) - before
        figures["unauthenticated_40mb_post"] = big
    finally:
        stop_server(server)

    (tmp_path / "hung").mkdir()
    figures["hung_store"] = hung_store(tmp_path / "hung")

    figures.update({
        "what": "what a client sees of kerneltune serve under load and faults, over loopback",
        "connections": FIGURE_CONNECTIONS, "phase_seconds": PHASE_S,
        "postgres": postgres, "cpus": os.cpu_count(), "python": platform.python_version(),
        "machine": platform.machine(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    })
    record = RELIABILITY if RECORDING else tmp_path / RELIABILITY.name
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    w, big, hung = (figures["writers_postgres"], figures["unauthenticated_40mb_post"],
                    figures["hung_store"])
    print(f"\nwriters: {w['posts']} posts, {w['errors']} errors, {w['lost_updates']} lost, "
          f"{w['posts_per_s']:.0f} posts/s; lookups (32 connections): "
          f"{figures['lookups_sqlite']['rate_per_s']:.0f}/s p99 "
          f"{figures['lookups_sqlite']['p99_ms']:.1f} ms (SQLite), "
          f"{figures['lookups_postgres']['rate_per_s']:.0f}/s (PostgreSQL); 40 MB POST: "
          f"{big['status']} in {big['answered_s']:.3f} s; hung store: readyz "
          f"{hung['readyz']['status']} in {hung['readyz']['seconds']:.2f} s")
    assert w["statuses"] == {"200": WRITERS * POSTS_PER_WRITER} and w["lost_updates"] == 0
    assert figures["writers_postgres_first_posts"]["errors"] == 0
    assert big["status"] == 401 and big["answered_s"] < 1.0
    assert big["healthz_during"]["max_ms"] < 500
    assert hung["readyz"]["status"] == 503 and hung["readyz"]["seconds"] < 3.0
    assert hung["lookup"]["status"] == 503 and hung["healthz_during_lookup"]["max_ms"] < 500
