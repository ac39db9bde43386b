"""Where tuned tables come from: a file or directory, the config service (cached on disk), the
tables shipped in the package.

Every loader returns a :class:`LoadedTable` or None and never raises: a missing, unreachable,
slow, failing or garbled source costs one warning (once per cause per process) and the
resolver moves on to the next source. Model code must never fail because tuning data is bad.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import urllib.error
import urllib.parse
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path

from kerneltune.table import Table, TableError, device_slug, load, loads, shipped_table_path

log = logging.getLogger("kerneltune.runtime")

ENV_TABLE = "KERNELTUNE_TABLE"
ENV_URL = "KERNELTUNE_URL"
ENV_CACHE_DIR = "KERNELTUNE_CACHE_DIR"
#: Seconds the runtime waits for the service, once per process, before using the next source.
SERVICE_TIMEOUT_S = 1.5


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
    """A table and where it came from: source is 'table', 'service', 'cache' or 'shipped'."""

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
    except (OSError, TableError) as e:
        warn_once(f"file:{path}", f"kerneltune: cannot use table {path}: {e}; ignoring it")
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
            except (OSError, TableError):
                continue
            if table.device == device:
                return LoadedTable("table", str(candidate), table)
        warn_once(f"dir:{path}", f"kerneltune: {ENV_TABLE}={path} holds no table for {device!r}")
        return None
    if not path.is_file():
        warn_once(f"missing:{path}", f"kerneltune: {ENV_TABLE}={path} does not exist; ignoring it")
        return None
    return _load_file(path, "table", device)


# ------------------------------------------------------------------------------- shipped


def shipped_table(device: str) -> LoadedTable | None:
    path = shipped_table_path(device)
    return _load_file(path, "shipped", device) if path.is_file() else None


# ------------------------------------------------------------------------------- service


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


def _read_cache(paths: CachePaths, device: str) -> tuple[Table, str | None] | None:
    if not paths.table.is_file():
        return None
    try:
        table = load(paths.table)
        etag = paths.etag.read_text().strip() if paths.etag.is_file() else None
    except (OSError, TableError) as e:
        warn_once(
            f"cache:{paths.table}",
            f"kerneltune: cached table {paths.table} is unreadable ({e}); fetching it again",
        )
        return None
    if table.device != device:
        return None
    return table, etag or None


def _write_cache(paths: CachePaths, body: bytes, etag: str | None) -> None:
    try:
        paths.table.parent.mkdir(parents=True, exist_ok=True)
        for path, data in ((paths.table, body), (paths.etag, (etag or "").encode())):
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
    except OSError as e:  # a read-only home must not break inference
        warn_once(f"cache-write:{paths.table}", f"kerneltune: cannot cache table: {e}")


def service_table(device: str, base_url: str | None = None,
                  timeout: float = SERVICE_TIMEOUT_S) -> LoadedTable | None:
    """The service's table for this device, revalidated against the on-disk cache by ETag.

    A service that is down, slow, failing or answers garbage costs one warning; the cached copy
    (if any) is used instead, labelled 'cache'.
    """
    base = base_url or os.environ.get(ENV_URL)
    if not base:
        return None
    url = table_url(base, device)
    paths = cache_paths(url, device)
    cached = _read_cache(paths, device)
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if cached and cached[1]:
        request.add_header("If-None-Match", cached[1])

    def fallback(why: str) -> LoadedTable | None:
        tail = "using the cached copy" if cached else "using the next source"
        warn_once(f"service:{base}", f"kerneltune: config service {url}: {why}; {tail}")
        return LoadedTable("cache", str(paths.table), cached[0]) if cached else None

    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
            etag = response.headers.get("ETag")
    except urllib.error.HTTPError as e:
        if e.code == 304 and cached:
            return LoadedTable("service", url, cached[0])
        if e.code == 404:
            log.info("kerneltune: the service at %s has no table for %r", base, device)
            return None
        return fallback(f"HTTP {e.code}")
    except (OSError, ValueError) as e:  # refused, unreachable, timed out, malformed URL
        return fallback(f"unreachable ({getattr(e, 'reason', e)})")
    try:
        table = loads(body)
    except TableError as e:
        return fallback(f"answered something that is not a table ({e})")
    if table.device != device:
        return fallback(f"answered a table for {table.device!r}")
    _write_cache(paths, body, etag)
    return LoadedTable("service", url, table)


def load_sources(device: str) -> list[LoadedTable]:
    """Every usable table for this device, in the order the resolver consults them."""
    found = (env_table(device), service_table(device), shipped_table(device))
    return [t for t in found if t is not None]

