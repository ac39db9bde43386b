"""Runtimes report the keys they ran untuned to the service (KERNELTUNE_URL with
KERNELTUNE_REPORT=1): the same notes the local record gets, in batches within the service's
bounds, from the background; a service that is down, slow or refusing costs one warning and
never a kernel call's time."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import warnings
from urllib.parse import quote

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from tests.api.live import start_server, stop_server

from kerneltune.runtime import local, record, sources

from .conftest import GPU, UvicornThread, kt_warnings
from .test_record import recorded, run_rms_norm


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """The real service (uvicorn, SQLite) on loopback."""
    tmp = tmp_path_factory.mktemp("service")
    server = start_server(tmp, f"sqlite:///{tmp / 'kt.db'}")
    yield server
    stop_server(server)


@pytest.fixture
def reporting(monkeypatch):
    def to(url: str) -> None:
        monkeypatch.setenv(sources.ENV_URL, url)
        monkeypatch.setenv(record.ENV_REPORT, "1")

    return to


def listed(url: str, device: str = GPU) -> dict[tuple, dict]:
    r = httpx.get(f"{url}/api/v1/misses/{quote(device, safe='')}", params={"limit": 1000})
    assert r.status_code == 200, r.text
    return {(k["kernel"], k["dtype"], k["n"], k["m"]): k for k in r.json()["keys"]}


def test_the_notes_reach_the_service_as_they_reach_the_record(service, reporting):
    reporting(service.url)
    for m in (5, 7, 3):
        run_rms_norm(m, n=40)  # buckets 8 (met at 5, then resolved) and 4
    record.flush()
    key8, key4 = ("rmsnorm_fwd", "float32", 40, 8), ("rmsnorm_fwd", "float32", 40, 4)
    assert set(recorded()) == {key8, key4}  # the local record as before
    found = listed(service.url)
    assert {k: (v["processes"], v["rows"]) for k, v in found.items()} == {
        key8: (1, [5]), key4: (1, [3])}
    run_rms_norm(6, n=40)  # resolved already: nothing new
    record.flush()
    assert listed(service.url)[key8]["processes"] == 1


def test_notes_past_the_service_bounds_go_in_batches(service):
    notes = {("rmsnorm_fwd", "bfloat16", n, 64): record.Miss(
        "rmsnorm_fwd", "bfloat16", n, 64, 1, list(range(33, 49)), "default", "default", 1.0, 1.0)
        for n in range(1, 301)}
    bodies = record.report_bodies("NVIDIA BATCHED", notes)
    assert [len(b["keys"]) for b in bodies] == [256, 44]
    assert all(len(json.dumps(b)) < 64 << 10 for b in bodies)
    assert record.report(f"{service.url}/api/v1/misses", "NVIDIA BATCHED", notes, timeout=20)
    assert len(listed(service.url, "NVIDIA BATCHED")) == 300


def test_a_dead_service_costs_one_warning_and_no_call(reporting, refused_url):
    reporting(refused_url)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_rms_norm(5)
        started = time.monotonic()
        record.flush()
        run_rms_norm(9)
        record.flush()
        flushed_s = time.monotonic() - started
    said = [w for w in kt_warnings(caught) if "report" in w]
    assert len(said) == 1 and "cannot report untuned shapes" in said[0]
    assert "KERNELTUNE_REPORT=0" in said[0] and "unreachable" in said[0]
    assert flushed_s < sources.SERVICE_TIMEOUT_S
    assert len(recorded()) == 2  # the local record has them all the same


class Misses:
    """A service whose misses endpoint answers slowly, or 429, and says when it was asked."""

    def __init__(self) -> None:
        self.mode = "slow"
        self.asked = threading.Event()
        self.posts = 0

    def app(self) -> Starlette:
        async def misses(request: Request) -> Response:
            await request.body()
            self.posts += 1
            self.asked.set()
            if self.mode == "429":
                return Response('{"detail": "too many"}', status_code=429,
                                headers={"Retry-After": "5"})
            await asyncio.sleep(3)
            return Response('{"recorded": 1}', status_code=202)

        return Starlette(routes=[Route("/api/v1/misses", misses, methods=["POST"])])


def test_a_slow_service_holds_no_call_and_is_left_at_the_deadline(reporting, monkeypatch):
    misses = Misses()
    monkeypatch.setattr(record, "FLUSH_AFTER_S", 0.01)  # the background write, at once
    monkeypatch.setenv(sources.ENV_FETCH_TIMEOUT, "2")
    in_flight = record._recorder.flushing  # held while notes are written and reported
    with UvicornThread(misses.app()) as server, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reporting(server.url)
        run_rms_norm(5)
        assert misses.asked.wait(10)  # the background report waits on the service
        monkeypatch.setattr(record, "FLUSH_AFTER_S", 60.0)  # the next key's: by hand
        run_rms_norm(17)  # a new key resolved and run meanwhile
        assert in_flight.locked()  # it did not wait for the report
        deadline = time.monotonic() + 10
        while in_flight.locked() and time.monotonic() < deadline:
            time.sleep(0.02)
        started = time.monotonic()
        record.flush()  # the new key's report: left at the deadline too
        assert 1.9 < time.monotonic() - started < 2.9
    said = [w for w in kt_warnings(caught) if "report" in w]
    assert len(said) == 1 and "within 2 s (KERNELTUNE_FETCH_TIMEOUT)" in said[0]
    assert len(recorded()) == 2


def test_429_drops_the_report_with_one_warning(reporting):
    misses = Misses()
    misses.mode = "429"
    with UvicornThread(misses.app()) as server, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reporting(server.url)
        run_rms_norm(5)
        record.flush()
        run_rms_norm(9)
        record.flush()
    said = [w for w in kt_warnings(caught) if "report" in w]
    assert len(said) == 1 and "HTTP 429" in said[0]
    assert misses.posts == 2  # each write tries, dropped again in silence


def test_no_report_without_the_setting(service, monkeypatch):
    monkeypatch.setenv(sources.ENV_URL, service.url)
    monkeypatch.delenv(record.ENV_REPORT, raising=False)
    run_rms_norm(5, n=56)
    record.flush()
    assert ("rmsnorm_fwd", "float32", 56, 8) in recorded()
    assert ("rmsnorm_fwd", "float32", 56, 8) not in listed(service.url)
    assert local.misses_path(GPU).is_file()


def test_record_0_reports_nothing_either(service, reporting, monkeypatch):
    reporting(service.url)
    monkeypatch.setenv(record.ENV_RECORD, "0")
    run_rms_norm(5, n=64)
    record.flush()
    assert ("rmsnorm_fwd", "float32", 64, 8) not in listed(service.url)
    assert not local.misses_path(GPU).exists()
