"""The page at `/` in a real headless browser (Debian's chromium): it loads, fills the table of
tuned configs and draws the chart from the JSON endpoints, and logs nothing to the console."""

from __future__ import annotations

import re
import shutil
import subprocess
from urllib.parse import urlencode

import pytest

from kerneltune.table import device_slug

from .live import GPU, KERNEL, OTHER_GPU, SEEDED_M, SEEDED_N, TOKEN, entry_json, seeded_entry

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def render(url: str, tmp_path) -> tuple[str, list[str]]:
    """The DOM once the page's scripts and fetches settled, and its console messages."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    result = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-extensions",
         f"--user-data-dir={tmp_path / 'chromium'}", "--enable-logging=stderr", "--v=0",
         # Virtual time runs until the page is idle (its fetches done) or the budget is spent.
         "--virtual-time-budget=15000", "--dump-dom", url],
        capture_output=True, text=True, timeout=120, check=True,
    )
    console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line]
    return result.stdout, console


def table_rows(dom: str) -> list[str]:
    body = re.search(r'<table id="configs">.*?<tbody>(.*?)</tbody>', dom, re.S)
    assert body, "no table of configs in the page"
    return re.findall(r"<tr[ >].*?</tr>", body.group(1), re.S)


def series_paths(dom: str) -> list[str]:
    return re.findall(r'<path(?=[^>]*class="series")[^>]*\sd="([^"]*)"', dom)


def test_page_shows_table_and_chart_for_a_gpu(server, tmp_path):
    query = urlencode({"gpu": GPU, "kernel": KERNEL, "dtype": "bfloat16"})
    dom, console = render(f"{server.url}/?{query}", tmp_path)
    assert console == []
    rows = table_rows(dom)
    # Every seeded shape, plus the stale entry shown greyed out (and left out of the chart).
    assert len(rows) == len(SEEDED_N) * len(SEEDED_M) + 1
    assert sum('class="stale"' in r for r in rows) == 1
    assert "BLOCK_N=" in rows[0] and "bfloat16" in rows[0]
    paths = series_paths(dom)
    assert len(paths) == len(SEEDED_M)  # one line per M bucket
    for d in paths:
        points = re.findall(r"[ML](\d+\.?\d*),(\d+\.?\d*)", d)
        assert len(points) == len(SEEDED_N)
    assert f"{len(rows)} tuned configs for {KERNEL} (bfloat16) on {GPU}" in dom


def test_page_accepts_a_slug_and_defaults_the_rest(server, tmp_path):
    dom, console = render(f"{server.url}/?gpu={device_slug(OTHER_GPU)}", tmp_path)
    assert console == []
    assert f"on {OTHER_GPU}." in dom
    assert len(table_rows(dom)) == 1
    assert len(series_paths(dom)) == 1
    assert KERNEL in dom  # the kernels known are listed


def test_every_m_bucket_has_its_own_colour(server, tmp_path):
    """A GPU tuned at 17 M buckets (1 to 65536 rows) gets 17 lines of 17 colours."""
    device = "Many Buckets GPU"
    entries = [entry_json(seeded_entry(n, 2**k)) for n in (1024, 4096) for k in range(17)]
    with server.client() as client:
        r = client.post("/api/v1/results", json={"device": device, "entries": entries},
                        headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200, r.text
    dom, console = render(f"{server.url}/?{urlencode({'gpu': device, 'kernel': KERNEL})}",
                          tmp_path)
    assert console == []
    strokes = re.findall(r'<path(?=[^>]*class="series")[^>]*\sstroke="([^"]*)"', dom)
    assert len(strokes) == 17 and len(set(strokes)) == 17, strokes
    assert "L2 cache" in dom  # why a fraction of copy can pass 100%


def test_the_api_docs_render_without_a_network(server, tmp_path):
    """/docs draws every operation from the service's own Swagger UI files (the browser has no
    way out: background networking is off and nothing else answers)."""
    dom, _ = render(f"{server.url}/docs", tmp_path)
    paths = re.findall(r'class="opblock-summary-path"[^>]*data-path="([^"]*)"', dom)
    assert "/api/v1/configs/{kernel}" in paths and "/api/v1/results" in paths, dom[-2000:]
