"""The shapes a model really runs: the keys this process resolved other than exactly, recorded
per GPU in the data directory (`kerneltune.runtime.local.misses_path`) for `kerneltune misses`
and `kerneltune tune --from-misses`.

A config is resolved once per (kernel, N, dtype, M bucket) per process, and that is where a
key is noted (`note`), in memory; a kernel call that finds its config resolved does nothing
more. The notes reach the file 10 s after the first of them (a background timer, for processes
that run for days) and at exit, merged under the file's lock with what other processes wrote:

    {"schema": 1, "device": "...", "keys": [
        {"kernel": "rmsnorm_fwd", "dtype": "bfloat16", "n": 4096, "m": 2048,
         "processes": 3, "rows": [1500, 2048, 1999], "match": "nearest", "source": "shipped",
         "first_seen": 1764900000.0, "last_seen": 1764990000.0}, ...]}

`processes` counts the processes that resolved the key (one each, however many calls they made:
counting calls would cost every call). `rows` is a sample of the row counts met at resolution
(at most `MAX_ROWS` distinct; once full, a new one replaces a random one with the chance a
reservoir sample gives it), `match` and `source` the last resolution's. The file holds at most
`MAX_KEYS` keys, those met by the most processes, then the most recently.

With `KERNELTUNE_REPORT=1` and `KERNELTUNE_URL` set, each write also reports its notes to the
service (`POST {URL}/api/v1/misses`), so that a fleet's tuning worker (`kerneltune tune
--follow`) sees them: every key with `processes` 1 (this process) and its rows, in batches within
the service's bounds (`REPORT_KEYS` keys, `REPORT_BYTES` bytes), all of them under one deadline
(`KERNELTUNE_FETCH_TIMEOUT`, as the table fetch). A service that is down, slow or refuses them
(429, any 4xx or 5xx) costs one warning, and the rest of the report is dropped: a report is a
hint, and the local record keeps the notes.

`KERNELTUNE_RECORD=0` turns recording, and so reporting, off. Nothing here may fail or slow a
kernel call: notes are taken in memory, written and reported from the background timer or at
exit, and a data directory that cannot be written costs one warning (`warn_once`), the notes
being dropped.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kerneltune.resolution import Resolution
from kerneltune.runtime.local import locked, misses_path, replace_file
from kerneltune.runtime.sources import (
    ENV_FETCH_TIMEOUT,
    ENV_URL,
    fetch_timeout,
    send,
    warn_once,
)

ENV_RECORD = "KERNELTUNE_RECORD"
ENV_REPORT = "KERNELTUNE_REPORT"
#: A report's bounds: the keys and bytes `POST /api/v1/misses` takes (256 keys, 64 KiB), less
#: some room for the envelope.
REPORT_KEYS = 256
REPORT_BYTES = 60 << 10
SCHEMA = 1
MAX_KEYS = 1000
MAX_ROWS = 16
#: Seconds from a process's first unwritten note to its background write.
FLUSH_AFTER_S = 10.0

Key = tuple[str, str, int, int]  # kernel, dtype, N, M bucket


def enabled() -> bool:
    """Whether this process records (KERNELTUNE_RECORD unset, or anything but 0/false/no/off)."""
    return os.environ.get(ENV_RECORD, "").strip().lower() not in ("0", "false", "no", "off")


@dataclass
class Miss:
    """One recorded key."""

    kernel: str
    dtype: str
    n: int
    m: int
    processes: int
    rows: list[int]
    match: str
    source: str
    first_seen: float
    last_seen: float

    @property
    def key(self) -> Key:
        return (self.kernel, self.dtype, self.n, self.m)


@dataclass
class Misses:
    """A GPU's record."""

    device: str
    keys: list[Miss] = field(default_factory=list)

    def ranked(self) -> list[Miss]:
        """Most processes first, then most recently met, then by key."""
        return sorted(self.keys, key=lambda k: (-k.processes, -k.last_seen, k.key))


def read(path: Path, device: str) -> Misses:
    """The record at `path`; an empty one where it is missing or does not parse (a record is a
    hint: a broken one is started again, not repaired)."""
    try:
        doc = json.loads(path.read_text())
        if doc.get("schema") != SCHEMA or doc.get("device") != device:
            raise ValueError("another schema or device")
        keys = [_miss(item) for item in doc["keys"]]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return Misses(device)
    return Misses(device, keys)


def _miss(d: Mapping[str, Any]) -> Miss:
    miss = Miss(
        kernel=str(d["kernel"]), dtype=str(d["dtype"]), n=int(d["n"]), m=int(d["m"]),
        processes=int(d["processes"]), rows=[int(r) for r in d["rows"]][:MAX_ROWS],
        match=str(d["match"]), source=str(d["source"]),
        first_seen=float(d["first_seen"]), last_seen=float(d["last_seen"]),
    )
    if miss.n < 1 or miss.m < 1 or miss.processes < 1:
        raise ValueError(f"not a recorded key: {d}")
    return miss


def merge(into: Misses, notes: Mapping[Key, Miss]) -> Misses:
    """`into` with this process's `notes` added (bounded as the module docstring says)."""
    held = {k.key: k for k in into.keys}
    for key, note in notes.items():
        old = held.get(key)
        if old is None:
            held[key] = Miss(**{**asdict(note), "rows": sorted(set(note.rows))[:MAX_ROWS]})
            continue
        old.processes += note.processes
        for rows in note.rows:
            if rows in old.rows:
                continue
            if len(old.rows) < MAX_ROWS:
                old.rows.append(rows)
            elif random.random() < MAX_ROWS / old.processes:
                old.rows[random.randrange(MAX_ROWS)] = rows
        old.rows.sort()
        old.match, old.source, old.last_seen = note.match, note.source, note.last_seen
    ranked = Misses(into.device, list(held.values())).ranked()[:MAX_KEYS]
    return Misses(into.device, ranked)


def write(path: Path, device: str, notes: Mapping[Key, Miss]) -> None:
    """Merge `notes` into the record at `path`, under its lock, replacing it atomically."""
    with locked(path):
        merged = merge(read(path, device), notes)
        replace_file(path, _dumps(merged))


def _dumps(misses: Misses) -> str:
    """The record as JSON, one key a line."""
    keys = ",\n".join(json.dumps(asdict(k)) for k in misses.keys)
    head = json.dumps({"schema": SCHEMA, "device": misses.device})[:-1]
    return f'{head}, "keys": [\n{keys}]}}\n'


def report_url() -> str | None:
    """Where this process reports its notes: the misses endpoint of the service at KERNELTUNE_URL
    where KERNELTUNE_REPORT is 1 (or true, yes, on); else None."""
    if os.environ.get(ENV_REPORT, "").strip().lower() not in ("1", "true", "yes", "on"):
        return None
    base = os.environ.get(ENV_URL, "").strip()
    return f"{base.rstrip('/')}/api/v1/misses" if base else None


def report_bodies(device: str, notes: Mapping[Key, Miss]) -> list[dict[str, Any]]:
    """`notes` as the bodies of `POST /api/v1/misses`, each within `REPORT_KEYS` keys and about
    `REPORT_BYTES` bytes."""
    bodies: list[dict[str, Any]] = []
    keys: list[dict[str, Any]] = []
    size = 0
    for note in notes.values():
        key = {"kernel": note.kernel, "dtype": note.dtype, "n": note.n, "m": note.m,
               "processes": note.processes, "rows": sorted(set(note.rows))[:MAX_ROWS]}
        grown = len(json.dumps(key)) + 2
        if keys and (len(keys) == REPORT_KEYS or size + grown > REPORT_BYTES):
            bodies.append({"device": device, "keys": keys})
            keys, size = [], 0
        keys.append(key)
        size += grown
    if keys:
        bodies.append({"device": device, "keys": keys})
    return bodies


def report(url: str, device: str, notes: Mapping[Key, Miss], timeout: float | None = None
           ) -> bool:
    """Post `notes` to the service's misses endpoint at `url`, all batches by one deadline
    (default: `fetch_timeout()`); whether the service took them all. A batch refused or not
    answered in time costs one warning per service, and the rest are dropped."""
    timeout = fetch_timeout() if timeout is None else timeout
    deadline = time.monotonic() + timeout
    for body in report_bodies(device, notes):
        left = deadline - time.monotonic()
        why = f"no complete answer within {timeout:g} s ({ENV_FETCH_TIMEOUT})"
        if left > 0:
            reply = send(url, body=body, timeout=left, max_bytes=64 << 10)
            if reply.ok:
                continue
            if not reply.timed_out:
                why = reply.why
        warn_once(f"report:{url}",
                  f"kerneltune: cannot report untuned shapes to {url}: {why}; dropped "
                  f"({ENV_REPORT}=0 turns reporting off)")
        return False
    return True


def forget(device: str, keys: set[Key]) -> int:
    """Drop `keys` from `device`'s record (tuned since); how many were there."""
    path = misses_path(device)
    if not path.is_file():
        return 0
    with locked(path):
        held = read(path, device)
        kept = [k for k in held.keys if k.key not in keys]
        if len(kept) != len(held.keys):
            replace_file(path, _dumps(Misses(device, kept)))
    return len(held.keys) - len(kept)


# ---------------------------------------------------------------- this process's notes


class _Recorder:
    """Notes kept in memory until written: (file, device) -> key -> note."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.flushing = threading.Lock()
        self.pending: dict[tuple[Path, str], dict[Key, Miss]] = {}
        self.timer: threading.Timer | None = None
        self.registered = False

    def note(self, device: str, found: Resolution, rows: int) -> None:
        if found.match == "exact" or not enabled():
            return
        try:
            path = misses_path(device)
        except Exception as e:  # no home directory, a device name with no letters
            warn_once(f"record:{device}", f"kerneltune: cannot record untuned shapes: {e}")
            return
        now = time.time()
        key = (found.kernel, found.dtype, found.n, found.m_bucket)
        with self.lock:
            notes = self.pending.setdefault((path, device), {})
            held = notes.get(key)
            if held is None:
                notes[key] = Miss(*key, processes=1, rows=[rows] if rows > 0 else [],
                                  match=found.match, source=found.source, first_seen=now,
                                  last_seen=now)
            elif rows > 0 and rows not in held.rows and len(held.rows) < MAX_ROWS:
                held.rows.append(rows)
            if not self.registered:
                atexit.register(self.flush)
                self.registered = True
            if self.timer is None:
                self.timer = threading.Timer(FLUSH_AFTER_S, self.flush)
                self.timer.name, self.timer.daemon = "kerneltune-record", True
                self.timer.start()

    def flush(self) -> None:
        """Write every pending note, and report it where this process reports; a file that
        cannot be written, or a service that does not take the report, costs one warning."""
        with self.flushing:
            with self.lock:
                pending, self.pending = self.pending, {}
                if self.timer is not None and self.timer is not threading.current_thread():
                    self.timer.cancel()
                self.timer = None
            url = report_url()
            for (path, device), notes in pending.items():
                try:
                    write(path, device, notes)
                except Exception as e:  # read-only, full, missing, locked: the model runs on
                    warn_once(f"record:{path.parent}",
                              f"kerneltune: cannot record untuned shapes in {path.parent}: {e} "
                              f"({ENV_RECORD}=0 turns recording off)")
                if url is not None:
                    report(url, device, notes)

    def after_fork(self) -> None:
        """A forked child starts with no notes (its parent writes its own) and no timer."""
        self.lock = threading.Lock()
        self.flushing = threading.Lock()
        self.pending, self.timer = {}, None


_recorder = _Recorder()
os.register_at_fork(after_in_child=_recorder.after_fork)


def note(device: str, found: Resolution, rows: int) -> None:
    """Note a resolution of this process (nothing for an exact match or with recording off)."""
    _recorder.note(device, found, rows)


def flush() -> None:
    """Write this process's notes now (they are written at exit anyway)."""
    _recorder.flush()
