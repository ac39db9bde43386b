"""Load on loopback: config lookups from a separate load-generator process against
`kerneltune serve` over a seeded SQLite store, for 20 s. At least 500 lookups/s with no error;
the rate and the latency percentiles are printed (pytest -s) and written to
benchmarks/results/api/loadtest.json.

One worker process: on two cores the other core runs the load generator. (With uvicorn's
multi-process mode, every answer took a fixed ~45 ms more here, whatever the concurrency.)

KERNELTUNE_LOADTEST_SECONDS, _CONCURRENCY and _WORKERS change the run (e.g. for a bigger host).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from kerneltune.table import device_slug

from .live import GPU, KERNEL, OTHER_GPU, seed_database, start_server, stop_server

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "benchmarks" / "results" / "api" / "loadtest.json"
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


def wait_for_workers(log: Path, workers: int, timeout_s: float = 180) -> None:
    """Until every worker process has started (each imports torch: seconds of CPU that would
    otherwise be taken from the measurement)."""
    deadline = time.monotonic() + timeout_s
    while log.read_text().count("Application startup complete") < workers:
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)


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
    record = RESULT if os.environ.get("KERNELTUNE_RECORD_LOADTEST") else tmp_path / RESULT.name
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"\nlookups: {result['rate_per_s']:.0f}/s over {result['seconds']:.1f} s, "
          f"p50 {result['p50_ms']:.2f} ms, p99 {result['p99_ms']:.2f} ms, "
          f"errors {result['errors']} (concurrency {CONCURRENCY}, {WORKERS} workers)")
    assert result["errors"] == 0, result["first_errors"]
    assert result["rate_per_s"] >= MIN_RATE
