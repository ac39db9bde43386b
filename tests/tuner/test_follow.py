"""A fleet's loop closed: model processes report the keys they ran untuned to the service, a
`kerneltune tune --follow URL` worker tunes them at their reported row counts and publishes the
entries, and the model processes' next runs resolve them exactly from the service's table. A
wrong token or a service that is down ends the worker with one line; a dead service costs a
model process one warning at most."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from tests.api.live import TOKEN, free_port, start_server, stop_server
from typer.testing import CliRunner

from kerneltune.cli import app
from kerneltune.kernels import REGISTRY
from kerneltune.table import INTERPRETER_DEVICE
from kerneltune.tuner.job import TuneKey

from .conftest import Stored

#: One call at a shape off every table (N = 24), checked against the reference; then which
#: table and match its key resolves to.
MODEL = """
import sys, torch, kerneltune
from kerneltune.kernels._spec import compare_outputs
from kerneltune.kernels.rmsnorm_fwd_spec import rmsnorm_fwd_ref
m = int(sys.argv[1])
x, w = torch.randn(m, 24), torch.randn(24)
y = kerneltune.rms_norm(x, w, 1e-6)
assert compare_outputs([y], [rmsnorm_fwd_ref(x, w, 1e-6)[0]]) is None
r = kerneltune.explain("rms_norm", x)
print(r.source, r.match)
"""
KEY = ("rmsnorm_fwd", "float32", 24, 8)
WORKER = ["-m", "kerneltune.cli", "tune", "--once", "--trials", "2", "--retime-rounds", "1",
          "--no-progress"]


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """The real service (uvicorn, SQLite) on loopback, with a write token."""
    tmp = tmp_path_factory.mktemp("fleet")
    server = start_server(tmp, f"sqlite:///{tmp / 'service.db'}", token=TOKEN)
    yield server
    stop_server(server)


def settings(home: Path, **extra: str) -> dict[str, str]:
    """A process of its own: its data and cache directories, no KERNELTUNE_* from outside."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELTUNE_")}
    return {**env, "TRITON_INTERPRET": "1", "KERNELTUNE_DATA_DIR": str(home / "data"),
            "KERNELTUNE_CACHE_DIR": str(home / "cache"), **extra}


def run_models(homes_rows: list[tuple[Path, int]], url: str) -> list[subprocess.CompletedProcess]:
    """The model script in one process per (home, row count), all at once."""
    procs = [subprocess.Popen(
        [sys.executable, "-c", MODEL, str(rows)], text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=settings(home, KERNELTUNE_URL=url, KERNELTUNE_REPORT="1"))
        for home, rows in homes_rows]
    done = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-3000:]
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


def queued(url: str) -> dict[tuple, dict]:
    r = httpx.get(f"{url}/api/v1/misses/{quote(INTERPRETER_DEVICE, safe='')}")
    assert r.status_code == 200, r.text
    return {(k["kernel"], k["dtype"], k["n"], k["m"]): k for k in r.json()["keys"]}


def worker(url: str, home: Path, token: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *WORKER, "--follow", url, "--db", f"sqlite:///{home / 'worker.db'}",
         *args], env=settings(home, KERNELTUNE_WRITE_TOKEN=token), capture_output=True,
        text=True, timeout=300)


def test_reported_keys_are_tuned_published_and_then_resolve_exactly(service, tmp_path):
    models = [(tmp_path / "model-a", 5), (tmp_path / "model-b", 6)]
    first = run_models(models, service.url)
    assert [p.stdout.split() for p in first] == [["default", "default"]] * 2
    assert all("cannot report" not in p.stderr for p in first)
    reported = queued(service.url)[KEY]
    assert (reported["processes"], reported["rows"], reported["tuned"]) == (2, [5, 6], False)

    done = worker(service.url, tmp_path / "worker", TOKEN)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tuning 1 keys the fleet met untuned" in done.stderr
    assert "published 1 entries" in done.stderr and "1 stored" in done.stderr
    assert KEY not in queued(service.url)  # tuned now
    table = httpx.get(f"{service.url}/api/v1/tables/{quote(INTERPRETER_DEVICE, safe='')}").json()
    (entry,) = [e for e in table["entries"] if (e["kernel"], e["dtype"], e["n"], e["m"]) == KEY]
    assert entry["trials"] == 2
    stored = Stored(f"sqlite:///{tmp_path / 'worker' / 'worker.db'}")
    try:  # tuned at the row counts the models ran, its pick checked at the fewest
        done_record = stored.study_attrs(TuneKey(INTERPRETER_DEVICE, *KEY), REGISTRY[KEY[0]])
    finally:
        stored.close()
    assert done_record["done"]["rows"] == [5, 6]

    again = run_models(models, service.url)
    assert [p.stdout.split() for p in again] == [["service", "exact"]] * 2

    idle = worker(service.url, tmp_path / "worker", TOKEN)  # nothing queued: nothing to do
    assert idle.returncode == 0, idle.stderr[-3000:]
    assert "tuning" not in idle.stderr and "published" not in idle.stderr
    assert f"nothing queued for {INTERPRETER_DEVICE}" in idle.stderr


def test_a_wrong_token_ends_the_worker_with_one_line_before_any_tuning(service, tmp_path):
    done = worker(service.url, tmp_path, "not-the-token-0123456789")
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"service {service.url} refused the write token (HTTP 401")
    assert "--token or KERNELTUNE_WRITE_TOKEN" in line
    assert not (tmp_path / "worker.db").exists()


def test_a_service_that_is_down_ends_the_worker_with_one_line(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    done = worker(url, tmp_path, TOKEN)
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"service {url}: unreachable")


def test_a_following_worker_waits_for_keys_and_stops_cleanly_on_ctrl_c(service, tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "kerneltune.cli", "tune", "--follow", service.url, "--device",
         "NVIDIA NOTHING-QUEUED", "--pause", "60", "--db", f"sqlite:///{tmp_path / 'w.db'}"],
        env=settings(tmp_path, KERNELTUNE_WRITE_TOKEN=TOKEN), stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        said = ""
        while "nothing new queued" not in said:
            line = proc.stderr.readline()
            assert line, f"the worker ended: {said}"
            said += line
        assert said.startswith(f"following {service.url} for NVIDIA NOTHING-QUEUED")
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=60)
    finally:
        watchdog.cancel()
    assert proc.returncode == 130 and rest.strip() == "stopped"


@pytest.mark.parametrize(("args", "said"), [
    (["--once"], "--once goes with --follow URL"),
    (["--follow", "http://127.0.0.1:9", "-k", "rmsnorm_fwd"], "takes its keys from the service"),
    (["--follow", "http://127.0.0.1:9", "--from-misses"], "takes its keys from the service"),
    (["--follow", "http://127.0.0.1:9"], "give the service's write token"),
])
def test_the_follow_options_are_checked_before_the_service_is_asked(monkeypatch, args, said):
    monkeypatch.delenv("KERNELTUNE_WRITE_TOKEN", raising=False)
    result = CliRunner().invoke(app, ["tune", *args])
    assert result.exit_code == 2
    assert said in " ".join(result.output.replace("│", " ").split())


DEAD = """
import torch, kerneltune
from kerneltune.runtime import record
for m in (5, 9, 17):  # three keys, each reported (and dropped) on its own
    kerneltune.rms_norm(torch.randn(m, 24), torch.randn(24), 1e-6)
    record.flush()
"""


def test_a_dead_service_costs_a_model_process_one_warning_at_most(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    home = tmp_path / "model"
    ran = subprocess.run([sys.executable, "-c", DEAD], capture_output=True, text=True,
                         timeout=240, env=settings(home, KERNELTUNE_URL=url,
                                                   KERNELTUNE_REPORT="1"))
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stderr.count("KerneltuneWarning: kerneltune: cannot report untuned shapes") == 1
    assert "unreachable" in ran.stderr
    misses = next((home / "data" / "misses").glob("*.json")).read_text()
    assert misses.count('"rmsnorm_fwd"') == 3  # the local record has them all the same
