"""Where tuned tables come from: a file or directory (KERNELTUNE_TABLE), the machine's own table
(`kerneltune.runtime.local`, written by every tune job, import and merge), the config service
(cached on disk), the tables shipped in the package.

Every loader returns a :class:`LoadedTable` or None and never raises: a missing, unreachable,
slow, failing or garbled source costs one warning (once per cause per process) and the
resolver moves on to the next source. Model code must never fail because tuning data is bad,
nor wait on it: the service fetch has one total deadline (KERNELTUNE_FETCH_TIMEOUT) and a size
cap (KERNELTUNE_FETCH_MAX_BYTES) that also bounds what its disk cache holds and loads.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.client
import json
import logging
import math
import os
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kerneltune.runtime import local
from kerneltune.table import Table, device_slug, load, loads, shipped_table_path

log = logging.getLogger("kerneltune.runtime")

ENV_TABLE = "KERNELTUNE_TABLE"
ENV_URL = "KERNELTUNE_URL"
ENV_CACHE_DIR = "KERNELTUNE_CACHE_DIR"


class KerneltuneWarning(RuntimeWarning):
    """A tuning source was unusable; kerneltune fell back to the next one."""


_warned: set[str] = set()
_warn_lock = threading.Lock()


def warn_once(cause: str, message: str) -> None:
    """Warn about `cause` the first time only (a model calls its kernels millions of times)."""
    with _warn_lock:
        if cause in _warned:
            return
        _warned.add(cause)
    log.warning(message)
    warnings.warn(message, KerneltuneWarning, stacklevel=2)


def forget_warnings() -> None:
    with _warn_lock:
        _warned.clear()


@dataclass(frozen=True)
class LoadedTable:
    """A table and where it came from: source is 'table', 'local', 'service', 'cache' or
    'shipped'."""

    source: str
    origin: str
    table: Table


def _for_device(table: Table, device: str, source: str, origin: str) -> LoadedTable | None:
    if table.device != device:
        warn_once(
            f"device:{origin}",
            f"kerneltune: {origin} is a table for {table.device!r}, not for this device "
            f"({device!r}); ignoring it",
        )
        return None
    return LoadedTable(source, origin, table)


def _load_file(path: Path, source: str, device: str) -> LoadedTable | None:
    try:
        table = load(path)
    except Exception as e:  # OSError, TableError, and what a hostile file can do to the decoder
        warn_once(f"file:{path}", f"kerneltune: cannot use table {path}: {_brief(e)}; ignoring it")
        return None
    return _for_device(table, device, source, str(path))


# ------------------------------------------------------------------------- KERNELTUNE_TABLE


def env_table(device: str) -> LoadedTable | None:
    """The table named by KERNELTUNE_TABLE: a file, or a directory holding `<device-slug>.json`
    (else any JSON table in it for this device)."""
    name = os.environ.get(ENV_TABLE)
    if not name:
        return None
    path = Path(name).expanduser()
    if path.is_dir():
        own = path / f"{device_slug(device)}.json"
        if own.is_file():
            return _load_file(own, "table", device)
        for candidate in sorted(path.glob("*.json")):
            try:
                table = load(candidate)
            except Exception:  # not a table: the directory may hold other JSON
                continue
            if table.device == device:
                return LoadedTable("table", str(candidate), table)
        warn_once(f"dir:{path}", f"kerneltune: {ENV_TABLE}={path} holds no table for {device!r}")
        return None
    if not path.is_file():
        warn_once(f"missing:{path}", f"kerneltune: {ENV_TABLE}={path} does not exist; ignoring it")
        return None
    return _load_file(path, "table", device)


# ------------------------------------------------------------------------- the local table


def local_table(device: str) -> LoadedTable | None:
    """The machine's own table for this device, in the user's data directory; None (silently)
    where no job, import or merge has written one."""
    try:
        path = local.table_path(device)
        if not path.is_file():
            return None
    except Exception as e:  # no home directory to find it in, an unreadable data directory
        warn_once(f"local:{device}", f"kerneltune: cannot look for the local table: {_brief(e)}")
        return None
    return _load_file(path, "local", device)


# ------------------------------------------------------------------------------- shipped


def shipped_table(device: str) -> LoadedTable | None:
    path = shipped_table_path(device)
    return _load_file(path, "shipped", device) if path.is_file() else None


# ------------------------------------------------------------------------------- service

ENV_FETCH_TIMEOUT = "KERNELTUNE_FETCH_TIMEOUT"
ENV_FETCH_MAX_BYTES = "KERNELTUNE_FETCH_MAX_BYTES"
#: Seconds, in all (connect, headers, body), the first kernel call waits for the service.
SERVICE_TIMEOUT_S = 1.5
#: The largest service answer read and cached: the largest shipped table is about 1.2 MB.
MAX_TABLE_BYTES = 16 * 2**20
#: An ETag longer than this, or not printable ASCII, is neither cached nor sent back.
MAX_ETAG_CHARS = 1024
#: The thread a fetch runs on, which the caller stops waiting for at the deadline.
FETCH_THREAD_NAME = "kerneltune-fetch"
_READ_CHUNK = 64 * 1024


def _positive_setting(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        warn_once(f"setting:{name}={raw}",
                  f"kerneltune: {name}={raw!r} is not a positive number; using {default:g}")
        return default
    return value


def fetch_timeout() -> float:
    """The total deadline of a service fetch, in seconds: KERNELTUNE_FETCH_TIMEOUT, else the
    default."""
    return _positive_setting(ENV_FETCH_TIMEOUT, SERVICE_TIMEOUT_S)


def max_table_bytes() -> int:
    """The size cap of a service answer and of its cached copy: KERNELTUNE_FETCH_MAX_BYTES, else
    the default."""
    return max(1, int(_positive_setting(ENV_FETCH_MAX_BYTES, MAX_TABLE_BYTES)))


def cache_dir() -> Path:
    return Path(os.environ.get(ENV_CACHE_DIR) or Path.home() / ".cache" / "kerneltune").expanduser()


def table_url(base: str, device: str) -> str:
    return f"{base.rstrip('/')}/api/v1/tables/{urllib.parse.quote(device, safe='')}"


@dataclass(frozen=True)
class CachePaths:
    table: Path
    etag: Path


def cache_paths(url: str, device: str) -> CachePaths:
    """One cache folder per service URL, one file per device (plus its ETag)."""
    folder = cache_dir() / "tables" / hashlib.sha256(url.encode()).hexdigest()[:16]
    stem = device_slug(device)
    return CachePaths(folder / f"{stem}.json", folder / f"{stem}.etag")


def _usable_etag(etag: str | None) -> str | None:
    """`etag` if it can go back into a request header as it is (no CR/LF smuggling, no giant)."""
    if etag and len(etag) <= MAX_ETAG_CHARS and all(" " <= c <= "~" for c in etag):
        return etag
    return None


def _brief(e: BaseException | str, limit: int = 300) -> str:
    """An error for a warning line: a hostile service chooses its text, so bound it."""
    text = e if isinstance(e, str) else (str(e) or type(e).__name__)
    return text if len(text) <= limit else text[:limit] + "..."


def _read_cache(paths: CachePaths, device: str, cap: int) -> tuple[Table, str | None] | None:
    """The cached table and its ETag; None (one warning) for a file over the cap, read no
    further than the cap, or one that does not load."""
    try:
        if not paths.table.is_file():
            return None
        size = paths.table.stat().st_size
        if size <= cap:
            with paths.table.open("rb") as f:
                body = f.read(cap + 1)
            size = len(body)
        if size > cap:
            warn_once(
                f"cache:{paths.table}",
                f"kerneltune: cached table {paths.table} is {size} bytes, over the cap of {cap} "
                f"({ENV_FETCH_MAX_BYTES}); ignoring it and fetching it again",
            )
            return None
        table = loads(body)
        etag = None
        if paths.etag.is_file():
            with paths.etag.open("rb") as f:
                etag = _usable_etag(f.read(MAX_ETAG_CHARS + 1).decode("ascii", "replace").strip())
    except Exception as e:  # OSError, TableError, and what a hostile file can do to the decoder
        warn_once(
            f"cache:{paths.table}",
            f"kerneltune: cached table {paths.table} is unreadable ({_brief(e)}); "
            f"fetching it again",
        )
        return None
    if table.device != device:
        return None
    return table, etag


def _write_cache(paths: CachePaths, body: bytes, etag: str | None, cap: int) -> None:
    if len(body) > cap:  # never the case for a capped fetch; the cache must not hold one
        return
    try:
        paths.table.parent.mkdir(parents=True, exist_ok=True)
        etag_bytes = (_usable_etag(etag) or "").encode()
        for path, data in ((paths.table, body), (paths.etag, etag_bytes)):
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
    except OSError as e:  # a read-only home must not break inference
        warn_once(f"cache-write:{paths.table}", f"kerneltune: cannot cache table: {e}")


class _TooLarge(Exception):
    """The answer is over the size cap; reading stopped there."""


@dataclass(frozen=True)
class _Answer:
    body: bytes
    etag: str | None


def _cut(sock: socket.socket) -> None:
    """Unblock whatever waits on `sock` (from another thread: shut down, not closed, so the fd
    cannot be reused under the reader)."""
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _Fetch:
    """One GET on a worker thread, answered by the deadline or abandoned.

    Socket timeouts bound each read, not the whole: a server trickling a byte at a time, or
    stalling its headers, keeps them all short. So the caller waits on this fetch no longer
    than the deadline, then shuts its sockets down, which ends the worker's blocked read. The
    worker also stops on its own at the deadline and at the size cap.
    """

    def __init__(self, request: urllib.request.Request, timeout: float, cap: int) -> None:
        self.request = request
        self.deadline = time.monotonic() + timeout
        self.cap = cap
        self.done = threading.Event()
        self.answer: _Answer | None = None
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._cut = False

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def attach(self, sock: socket.socket) -> None:
        """A socket of this fetch (each connection, each TLS layer), to cut at the deadline."""
        with self._lock:
            self._sockets.append(sock)
            cut = self._cut
        if cut:
            _cut(sock)

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            sockets = list(self._sockets)
        for sock in sockets:
            _cut(sock)

    def run(self) -> None:
        try:
            self.answer = self._get()
        except BaseException as e:  # all of it goes to the caller, nothing to the thread hook
            self.error = e
            if isinstance(e, urllib.error.HTTPError):
                e.close()
        finally:
            self.done.set()

    def _get(self) -> _Answer:
        opener = _opener(self)
        with opener.open(self.request, timeout=max(self.remaining(), 0.001)) as response:
            announced = (response.headers.get("Content-Length") or "").strip()
            if announced.isdigit() and int(announced) > self.cap:
                raise _TooLarge(f"an answer of {int(announced)} bytes, over the cap of {self.cap}")
            body = bytearray()
            while True:
                left = self.remaining()
                if left <= 0:
                    raise TimeoutError("the deadline passed while reading the answer")
                with self._lock:
                    current = self._sockets[-1] if self._sockets else None
                if current is not None:
                    current.settimeout(left)
                chunk = response.read1(min(_READ_CHUNK, self.cap + 1 - len(body)))
                if not chunk:
                    break
                body += chunk
                if len(body) > self.cap:
                    raise _TooLarge(f"an answer over the cap of {self.cap} bytes")
            return _Answer(bytes(body), response.headers.get("ETag"))


def _hand_over(conn: http.client.HTTPConnection, fetch: _Fetch) -> None:
    """Make `conn` give each TCP socket to `fetch` as soon as it is connected (before a proxy
    tunnel or a TLS handshake, which could stall too)."""
    connect = conn._create_connection

    def create_connection(*args: Any, **kwargs: Any) -> socket.socket:
        sock = connect(*args, **kwargs)
        fetch.attach(sock)
        return sock

    conn._create_connection = create_connection


class _Connection(http.client.HTTPConnection):
    def __init__(self, *args: Any, fetch: _Fetch, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _hand_over(self, fetch)


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, fetch: _Fetch) -> None:
        super().__init__()
        self._fetch = fetch

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_Connection, fetch=self._fetch), req)


if hasattr(http.client, "HTTPSConnection"):  # Python built with ssl

    class _TLSConnection(http.client.HTTPSConnection):
        """Hands over its TCP socket, then the TLS socket over it."""

        def __init__(self, *args: Any, fetch: _Fetch, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._fetch = fetch
            _hand_over(self, fetch)

        def connect(self) -> None:
            super().connect()
            self._fetch.attach(self.sock)

    class _HTTPSHandler(urllib.request.HTTPSHandler):
        def __init__(self, fetch: _Fetch) -> None:
            super().__init__()
            self._fetch = fetch

        def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(functools.partial(_TLSConnection, fetch=self._fetch), req,
                                context=self._context)


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follows a few redirects without reading the redirect's own body (urllib reads it whole,
    and a hostile service can make it endless)."""

    max_redirections = 4

    def http_error_302(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                       headers: Any) -> Any:
        fp.close()
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


def _opener(fetch: _Fetch) -> urllib.request.OpenerDirector:
    """urllib's usual opener (proxies from the environment, redirects, HTTP errors raised) for
    http and https only: a URL of any other scheme fails as unknown."""
    opener = urllib.request.OpenerDirector()
    handlers: list[urllib.request.BaseHandler] = [
        urllib.request.ProxyHandler(), urllib.request.UnknownHandler(), _HTTPHandler(fetch),
        urllib.request.HTTPDefaultErrorHandler(), _Redirects(),
        urllib.request.HTTPErrorProcessor(),
    ]
    if hasattr(http.client, "HTTPSConnection"):
        handlers.append(_HTTPSHandler(fetch))
    for handler in handlers:
        opener.add_handler(handler)
    return opener


def _fetch(request: urllib.request.Request, timeout: float, cap: int
           ) -> tuple[_Answer | None, BaseException | None]:
    """The answer to `request` or why there is none, by the deadline whatever the server does."""
    fetch = _Fetch(request, timeout, cap)
    worker = threading.Thread(target=fetch.run, name=FETCH_THREAD_NAME, daemon=True)
    worker.start()
    if not fetch.done.wait(max(fetch.remaining(), 0)):
        fetch.cut()
        return None, TimeoutError()
    return fetch.answer, fetch.error


@dataclass(frozen=True)
class Reply:
    """What the service answered to `send`: the body of a 2xx answer (`ok`), else why there is
    none, as a line for a warning or an error (`why`), with the HTTP status where one came and
    its Retry-After, or whether the deadline passed first."""

    ok: bool
    body: bytes = b""
    why: str = ""
    status: int | None = None
    retry_after: str | None = None
    timed_out: bool = False


def send(url: str, *, body: Any = None, token: str | None = None, timeout: float,
         max_bytes: int = MAX_TABLE_BYTES) -> Reply:
    """One request to the service by the machinery of the table fetch (one total deadline for
    connect, headers and body, a size cap on the answer, http and https only): POST `body` as
    JSON where given, else GET; a bearer `token` where given. Raises nothing."""
    headers = {"Accept": "application/json"}
    data = None
    try:
        if body is not None:
            data = json.dumps(body, allow_nan=False).encode()
            headers["Content-Type"] = "application/json"
        if token:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(url, data=data, headers=headers,
                                         method="GET" if data is None else "POST")
    except ValueError as e:  # not a URL, not JSON
        return Reply(False, why=_brief(e))
    answer, e = _fetch(request, timeout, max_bytes)
    if isinstance(e, urllib.error.HTTPError):
        retry = e.headers.get("Retry-After") if e.headers is not None else None
        return Reply(False, why=f"HTTP {e.code} {_brief(str(e.reason), 80)}", status=e.code,
                     retry_after=retry)
    if isinstance(e, TimeoutError) or (
            isinstance(e, urllib.error.URLError) and isinstance(e.reason, TimeoutError)):
        return Reply(False, why=f"no complete answer within {timeout:g} s", timed_out=True)
    if isinstance(e, _TooLarge):
        return Reply(False, why=str(e))
    if isinstance(e, urllib.error.URLError):  # refused, unreachable, not http(s)
        return Reply(False, why=f"unreachable ({_brief(str(e.reason))})")
    if e is not None or answer is None:  # reset, cut short, malformed, anything else
        return Reply(False, why=f"failed ({type(e).__name__}: {_brief(e or 'no answer')})")
    return Reply(True, answer.body)


def service_table(device: str, base_url: str | None = None,
                  timeout: float | None = None, *, max_bytes: int | None = None
                  ) -> LoadedTable | None:
    """The service's table for this device, revalidated against the on-disk cache by ETag.

    `timeout` is one deadline for the whole fetch (default: `fetch_timeout()`), `max_bytes` the
    cap on the answer and the cache (default: `max_table_bytes()`). Whatever the service does,
    this returns by then and raises nothing: any failure costs one warning and the cached copy
    (if any) is used instead, labelled 'cache'.
    """
    base = base_url or os.environ.get(ENV_URL)
    if not base:
        return None
    try:
        return _service_table(device, base, timeout, max_bytes)
    except Exception as e:  # a failure nobody foresaw must still not reach model code
        warn_once(f"service:{base}",
                  f"kerneltune: config service {base}: failed ({_brief(e)}); "
                  f"using the next source")
        return None


def _service_table(device: str, base: str, timeout: float | None, max_bytes: int | None
                   ) -> LoadedTable | None:
    timeout = fetch_timeout() if timeout is None else timeout
    cap = max_table_bytes() if max_bytes is None else max_bytes
    url = table_url(base, device)
    paths = cache_paths(url, device)
    cached = _read_cache(paths, device, cap)

    def fallback(why: str) -> LoadedTable | None:
        tail = "using the cached copy" if cached else "using the next source"
        warn_once(f"service:{base}",
                  f"kerneltune: config service {url}: {_brief(why)}; {tail}")
        return LoadedTable("cache", str(paths.table), cached[0]) if cached else None

    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if cached and cached[1]:
        request.add_header("If-None-Match", cached[1])
    answer, e = _fetch(request, timeout, cap)
    if isinstance(e, urllib.error.HTTPError):
        if e.code == 304 and cached:
            return LoadedTable("service", url, cached[0])
        if e.code == 404:
            log.info("kerneltune: the service at %s has no table for %r", base, device)
            return None
        return fallback(f"HTTP {e.code}")
    if isinstance(e, TimeoutError) or (
            isinstance(e, urllib.error.URLError) and isinstance(e.reason, TimeoutError)):
        return fallback(f"no complete answer within {timeout:g} s ({ENV_FETCH_TIMEOUT})")
    if isinstance(e, _TooLarge):
        return fallback(f"{e} ({ENV_FETCH_MAX_BYTES})")
    if isinstance(e, urllib.error.URLError):  # refused, unreachable, not http(s)
        return fallback(f"unreachable ({_brief(str(e.reason))})")
    if e is not None or answer is None:  # reset, cut short, malformed, anything else
        return fallback(f"failed ({type(e).__name__}: {_brief(e or 'no answer')})")
    try:
        table = loads(answer.body)
    except Exception as err:  # TableError, and what a hostile answer can do to the decoder
        return fallback(f"answered something that is not a table ({_brief(err)})")
    if table.device != device:
        return fallback(f"answered a table for {table.device!r}")
    _write_cache(paths, answer.body, answer.etag, cap)
    return LoadedTable("service", url, table)


def load_sources(device: str) -> list[LoadedTable]:
    """Every usable table for this device, in the order the resolver consults them."""
    found = (env_table(device), local_table(device), service_table(device), shipped_table(device))
    return [t for t in found if t is not None]

