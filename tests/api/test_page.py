"""The page at `/` in a real headless browser (Debian's chromium): it loads, fills the table of
tuned configs and draws the chart from the JSON endpoints, and logs nothing to the console."""

from __future__ import annotations

import re
import shutil
import subprocess
from urllib.parse import urlencode

import pytest

from kerneltune.table import device_slug

from .live import GPU, KERNEL, OTHER_GPU, SEEDED_M, SEEDED_N

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
