"""The service fetch cannot hold or break a model: one total deadline, a size cap on the answer
and on its disk cache, and every failure ending in the fallback with one warning.

The misbehaving services are real loopback servers speaking raw HTTP from threads, so each one
can trickle, stall, flood or reset exactly as a broken or hostile service would.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch

import kerneltune
from kerneltune.kernels import rmsnorm_fwd_spec
from kerneltune.kernels._spec import compare_outputs
from kerneltune.runtime import sources
from kerneltune.table import dumps, shipped_tables_dir

from .conftest import DEVICE, GPU, entry, kt_warnings, resolution, table, write_shipped

N, M = 64, 8
#: The deadline most tests set (KERNELTUNE_FETCH_TIMEOUT), and how late a return may be.
DEADLINE_S = 0.5
MARGIN_S = 0.6
#: The trickling servers send one byte this often.
TRICKLE_S = 0.3

Handler = Callable[[socket.socket, "RawServer"], None]


class RawServer:
    """A loopback HTTP server that answers every connection with `handler` on its own thread."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.connections = 0
        self.sent = 0  # body bytes the handlers managed to send, where they count them

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            worker = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(worker)
            worker.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                read_request(conn)
                self.handler(conn, self)
            except OSError:  # the client went away: what a cut-off fetch looks like
                pass

    def __enter__(self) -> RawServer:
        accept = threading.Thread(target=self._accept, daemon=True)
        self.threads.append(accept)
        accept.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.listener.close()
        for thread in self.threads:
            thread.join(timeout=5)


def read_request(conn: socket.socket) -> bytes:
    conn.settimeout(5)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    conn.settimeout(None)
    return data


def head(status: str = "200 OK", **headers: object) -> bytes:
    lines = [f"HTTP/1.1 {status}", "Content-Type: application/json", "Connection: close"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def trickle(conn: socket.socket, stop: threading.Event, data: bytes) -> None:
    for i in range(len(data)):
        if stop.wait(TRICKLE_S):
            return
        conn.sendall(data[i:i + 1])


def table_body(skip: int = 1) -> bytes:
    return dumps(table(entry("rmsnorm_fwd", N, M, skip=skip))).encode()


def check_outputs_correct(m: int = M, n: int = N) -> None:
    """rms_norm with whatever config was resolved matches the float64 reference."""
    g = torch.Generator().manual_seed(m * 1000 + n)
    x, w = (torch.randn(*shape, generator=g).to(DEVICE) for shape in ((m, n), (n,)))
    y = kerneltune.rms_norm(x, w, 1e-6)
    assert compare_outputs([y], [rmsnorm_fwd_spec.rmsnorm_fwd_ref(x, w, 1e-6)[0]]) is None


@pytest.fixture
def shipped_entry(shipped_dir):
    """The shipped table holds the shape the tests resolve: the fallback shows as 'shipped'."""
    e = entry("rmsnorm_fwd", N, M, skip=2)
    write_shipped(shipped_dir, table(e))
    return e


@pytest.fixture
def deadline(monkeypatch) -> float:
    monkeypatch.setenv(sources.ENV_FETCH_TIMEOUT, str(DEADLINE_S))
    return DEADLINE_S


@contextmanager
def recorded() -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        yield record


def cache_of(url: str) -> sources.CachePaths:
    return sources.cache_paths(sources.table_url(url, GPU), GPU)


def fetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == sources.FETCH_THREAD_NAME]


def resolve_against(handler: Handler, monkeypatch, limit: float
                    ) -> tuple[float, list[str], RawServer]:
    """The first resolution with the service answering through `handler`: its duration, the
    warnings it gave, the server. Its source must be the shipped fallback."""
    with RawServer(handler) as server:
        monkeypatch.setenv(sources.ENV_URL, server.url)
        with recorded() as record:
            start = time.monotonic()
            r = resolution("rmsnorm_fwd", M, N)
            took = time.monotonic() - start
            check_outputs_correct()
        assert r.source == "shipped", r
        assert took < limit + MARGIN_S, f"held {took:.2f} s for a {limit} s deadline"
        assert not cache_of(server.url).table.exists()
    end = time.monotonic() + 2  # the cut-off fetch does not linger either
    while fetch_threads() and time.monotonic() < end:
        time.sleep(0.02)
    assert not fetch_threads()
    return took, kt_warnings(record), server


# ------------------------------------------------------------------------------ deadline


def test_the_default_deadline_is_at_most_two_seconds(monkeypatch):
    monkeypatch.delenv(sources.ENV_FETCH_TIMEOUT, raising=False)
    assert 0 < sources.fetch_timeout() <= 2.0


def test_a_trickling_body_is_cut_at_the_default_deadline(monkeypatch, shipped_entry):
    """One byte every 0.3 s never trips a per-read timeout; the total deadline still holds."""
    monkeypatch.delenv(sources.ENV_FETCH_TIMEOUT, raising=False)

    def handler(conn: socket.socket, server: RawServer) -> None:
        body = table_body()
        conn.sendall(head(Content_Length=len(body)))
        trickle(conn, server.stop, body)

    took, messages, _ = resolve_against(handler, monkeypatch, sources.fetch_timeout())
    assert took >= sources.fetch_timeout() - 0.1  # it did wait for the service, no longer
    assert len(messages) == 1 and "config service" in messages[0], messages
    assert "within" in messages[0]


def test_trickling_headers_are_cut_at_the_deadline(monkeypatch, deadline, shipped_entry):
    def handler(conn: socket.socket, server: RawServer) -> None:
        trickle(conn, server.stop, head(X_Padding="x" * 1000))

    _, messages, _ = resolve_against(handler, monkeypatch, deadline)
    assert len(messages) == 1 and "within" in messages[0], messages


def test_a_service_that_never_answers_is_cut_at_the_deadline(monkeypatch, deadline,
                                                             shipped_entry):
    def handler(conn: socket.socket, server: RawServer) -> None:
        server.stop.wait(30)

    _, messages, server = resolve_against(handler, monkeypatch, deadline)
    assert server.connections == 1
    assert len(messages) == 1 and "within" in messages[0], messages


def test_the_deadline_setting_is_checked(monkeypatch):
    monkeypatch.setenv(sources.ENV_FETCH_TIMEOUT, "0.25")
    assert sources.fetch_timeout() == 0.25
    for bad in ("soon", "-1", "0", "nan", "inf"):
        sources.forget_warnings()
        monkeypatch.setenv(sources.ENV_FETCH_TIMEOUT, bad)
        with pytest.warns(sources.KerneltuneWarning, match=sources.ENV_FETCH_TIMEOUT):
            assert sources.fetch_timeout() == sources.SERVICE_TIMEOUT_S


# ------------------------------------------------------------------------------ size cap


@pytest.mark.parametrize("announced", [True, False], ids=["content-length", "until-close"])
def test_a_300_mb_answer_is_not_read_past_the_cap(announced, monkeypatch, deadline,
                                                  shipped_entry):
    """A valid table padded with 300 MB of JSON whitespace: read up to the cap, then dropped."""
    monkeypatch.delenv(sources.ENV_FETCH_MAX_BYTES, raising=False)
    size = 300 * 2**20
    pad = b" " * 2**20

    def handler(conn: socket.socket, server: RawServer) -> None:
        body = table_body()
        conn.sendall(head(Content_Length=len(body) + size) if announced else head())
        conn.sendall(body)
        for _ in range(size // len(pad)):
            if server.stop.is_set():
                return
            conn.sendall(pad)
            server.sent += len(pad)

    _, messages, server = resolve_against(handler, monkeypatch, deadline)
    assert len(messages) == 1 and "bytes" in messages[0], messages
    # the cap, plus what the loopback buffers took in before the client stopped reading
    assert server.sent < sources.MAX_TABLE_BYTES + 48 * 2**20, server.sent


def test_an_answer_one_byte_over_the_cap_is_refused_and_not_cached(monkeypatch, served,
                                                                   shipped_entry):
    body = table(entry("rmsnorm_fwd", N, M, skip=1))
    served.serve(body)
    monkeypatch.setenv(sources.ENV_URL, served.url)
    monkeypatch.setenv(sources.ENV_FETCH_MAX_BYTES, str(len(served.body) - 1))
    with recorded() as record:
        r = resolution("rmsnorm_fwd", M, N)
    assert r.source == "shipped"
    messages = kt_warnings(record)
    assert len(messages) == 1 and str(len(served.body) - 1) in messages[0], messages
    assert not cache_of(served.url).table.exists()


def test_an_answer_at_the_cap_is_used_and_cached(monkeypatch, served, shipped_entry):
    e = entry("rmsnorm_fwd", N, M, skip=1)
    served.serve(table(e), etag='"at-cap"')
    monkeypatch.setenv(sources.ENV_URL, served.url)
    monkeypatch.setenv(sources.ENV_FETCH_MAX_BYTES, str(len(served.body)))
    with recorded() as record:
        r = resolution("rmsnorm_fwd", M, N)
    assert (r.source, r.entry.config) == ("service", e.config)
    assert kt_warnings(record) == []
    paths = cache_of(served.url)
    assert paths.table.read_bytes() == served.body and paths.etag.read_text() == '"at-cap"'


def test_the_cap_setting_is_checked(monkeypatch):
    monkeypatch.setenv(sources.ENV_FETCH_MAX_BYTES, "4096")
    assert sources.max_table_bytes() == 4096
    sources.forget_warnings()
    monkeypatch.setenv(sources.ENV_FETCH_MAX_BYTES, "lots")
    with pytest.warns(sources.KerneltuneWarning, match=sources.ENV_FETCH_MAX_BYTES):
        assert sources.max_table_bytes() == sources.MAX_TABLE_BYTES
    # the default holds the largest shipped table four times over
    shipped = shipped_tables_dir().glob("*.json")
    assert max(p.stat().st_size for p in shipped) * 4 <= sources.MAX_TABLE_BYTES


def write_cache(url: str, body: bytes, etag: str) -> sources.CachePaths:
    paths = cache_of(url)
    paths.table.parent.mkdir(parents=True, exist_ok=True)
    paths.table.write_bytes(body)
    paths.etag.write_text(etag)
    return paths


def test_an_oversized_cache_file_is_ignored_and_replaced(monkeypatch, served):
    """Padded past the cap, a cached table (even a valid one) is neither loaded nor revalidated:
    fetched anew, with one warning."""
    cap = 4096
    monkeypatch.setenv(sources.ENV_FETCH_MAX_BYTES, str(cap))
    stale = dumps(table(entry("rmsnorm_fwd", N, M, skip=3))).encode()
    fresh = entry("rmsnorm_fwd", N, M, skip=1)
    served.serve(table(fresh), etag='"same"')
    monkeypatch.setenv(sources.ENV_URL, served.url)
    paths = write_cache(served.url, stale + b" " * (cap + 1 - len(stale)), '"same"')
    with recorded() as record:
        r = resolution("rmsnorm_fwd", M, N)
    assert (r.source, r.entry.config) == ("service", fresh.config)
    assert served.requests == [(GPU, None)]  # no If-None-Match for a cache it refused
    messages = kt_warnings(record)
    assert len(messages) == 1 and str(cap) in messages[0], messages
    assert paths.table.read_bytes() == served.body


def test_an_oversized_cache_file_is_no_fallback(monkeypatch, refused_url, shipped_entry):
    cap = 4096
    monkeypatch.setenv(sources.ENV_FETCH_MAX_BYTES, str(cap))
    cached = dumps(table(entry("rmsnorm_fwd", N, M, skip=3))).encode()
    write_cache(refused_url, cached + b" " * (cap + 1 - len(cached)), '"v1"')
    monkeypatch.setenv(sources.ENV_URL, refused_url)
    with recorded() as record:
        r = resolution("rmsnorm_fwd", M, N)
    assert (r.source, r.entry.config) == ("shipped", shipped_entry.config)
    messages = kt_warnings(record)
    assert len(messages) == 2, messages  # one for the cache file, one for the service
    assert str(cap) in messages[0] and "config service" in messages[1]


def test_an_unsafe_cached_etag_is_not_sent(monkeypatch, served):
    e = entry("rmsnorm_fwd", N, M, skip=1)
    served.serve(table(e))
    monkeypatch.setenv(sources.ENV_URL, served.url)
    write_cache(served.url, served.body, '"v1"\r\nX-Injected: 1')
    with recorded() as record:
        r = resolution("rmsnorm_fwd", M, N)
    assert (r.source, r.entry.config) == ("service", e.config)
    assert served.requests == [(GPU, None)] and kt_warnings(record) == []


# ------------------------------------------------------------------------------ failures


def rst(conn: socket.socket) -> None:
    """Close with a TCP reset rather than a clean end of stream."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


@pytest.mark.parametrize("ending", ["close", "reset"])
def test_a_connection_ended_mid_body_falls_back(ending, monkeypatch, deadline, shipped_entry):
    def handler(conn: socket.socket, server: RawServer) -> None:
        body = table_body()
        conn.sendall(head(Content_Length=len(body)) + body[: len(body) // 2])
        time.sleep(0.05)
        if ending == "reset":
            rst(conn)

    _, messages, _ = resolve_against(handler, monkeypatch, deadline)
    assert len(messages) == 1 and "config service" in messages[0], messages


#: Answers the JSON decoder itself fails on with something other than a decoding error.
BAD_BODIES = {
    "deeply-nested": b"[" * 200_000,
    "huge-integer": b'{"schema": ' + b"9" * 5000 + b"}",
}


@pytest.mark.parametrize("body", BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_any_garbled_answer_falls_back(body, monkeypatch, deadline, shipped_entry):
    def handler(conn: socket.socket, server: RawServer) -> None:
        conn.sendall(head(Content_Length=len(body)) + body)

    _, messages, _ = resolve_against(handler, monkeypatch, deadline)
    assert len(messages) == 1 and "not a table" in messages[0], messages


def test_a_redirect_body_is_not_drained(monkeypatch, deadline, shipped_entry):
    """A redirect whose body never ends: followed, without reading that body."""
    pad = b" " * 2**20

    def handler(conn: socket.socket, server: RawServer) -> None:
        if server.connections > 1:
            body = table_body(skip=1)
            conn.sendall(head(Content_Length=len(body)) + body)
            return
        conn.sendall(head("302 Found", Location="/api/v1/tables/moved"))
        for _ in range(300):
            if server.stop.is_set():
                return
            conn.sendall(pad)
            server.sent += len(pad)

    with RawServer(handler) as server:
        monkeypatch.setenv(sources.ENV_URL, server.url)
        with recorded() as record:
            r = resolution("rmsnorm_fwd", M, N)
        assert (r.source, r.match) == ("service", "exact")
        assert kt_warnings(record) == []
        assert server.sent < 48 * 2**20


def test_only_http_services_are_fetched(monkeypatch, tmp_path, shipped_entry):
    """A file:// "service" would bypass the deadline and the cap: tables on disk are what
    KERNELTUNE_TABLE is for."""
    url = f"file://{tmp_path}"
    path = tmp_path / "api" / "v1" / "tables" / GPU  # where urllib would read it from
    path.parent.mkdir(parents=True)
    path.write_bytes(table_body(skip=1))
    monkeypatch.setenv(sources.ENV_URL, url)
    with recorded() as record:
        r = resolution("rmsnorm_fwd", M, N)
    assert r.source == "shipped"
    messages = kt_warnings(record)
    assert len(messages) == 1 and "config service" in messages[0], messages


def test_a_valid_chunked_answer_is_used_and_cached(monkeypatch, deadline):
    body = table_body(skip=1)

    def handler(conn: socket.socket, server: RawServer) -> None:
        conn.sendall(head(Transfer_Encoding="chunked", ETag='"c1"'))
        for i in range(0, len(body), 100):
            piece = body[i:i + 100]
            conn.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        conn.sendall(b"0\r\n\r\n")

    with RawServer(handler) as server:
        monkeypatch.setenv(sources.ENV_URL, server.url)
        with recorded() as record:
            r = resolution("rmsnorm_fwd", M, N)
            check_outputs_correct()
        assert (r.source, r.match) == ("service", "exact")
        assert kt_warnings(record) == []
        paths = cache_of(server.url)
        assert paths.table.read_bytes() == body and paths.etag.read_text() == '"c1"'
