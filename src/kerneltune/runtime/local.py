"""The machine's own files in the user's data directory: a tuned table per GPU, which every
`kerneltune tune`, `import` and `merge` refreshes and the runtime reads, and the record of the
shapes the runtime met untuned (`kerneltune.runtime.record`).

The data directory is `KERNELTUNE_DATA_DIR`, else `$XDG_DATA_HOME/kerneltune`, else
`~/.local/share/kerneltune`. Beneath it::

    tables/<device-slug>.json    the GPU's table (the format of `kerneltune.table`)
    misses/<device-slug>.json    the keys the runtime resolved other than exactly

Several processes may refresh one file at once (tuning workers, model processes exiting). Each
writer takes an exclusive `fcntl.flock` on `<file>.lock`, reads the file, merges into it and
replaces it atomically (a temporary file, then `os.replace`): no writer loses another's work,
and a reader, which takes no lock, sees the old file or the new one, never a part of either.

Standard library and the table format only: the runtime imports this, and so do the tuner's
commands.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from kerneltune.table import Entry, Table, TableError, device_slug, dumps, load

ENV_DATA_DIR = "KERNELTUNE_DATA_DIR"
TABLES = "tables"
MISSES = "misses"
#: How long a writer waits for another's lock before giving up (a writer holds it for the
#: time of one read, merge and write of a small file).
LOCK_TIMEOUT_S = 10.0


def data_dir() -> Path:
    """The user's data directory for kerneltune (see the module docstring)."""
    own = os.environ.get(ENV_DATA_DIR, "").strip()
    if own:
        return Path(own).expanduser()
    base = os.environ.get("XDG_DATA_HOME", "").strip() or Path.home() / ".local" / "share"
    return Path(base).expanduser() / "kerneltune"


def table_path(device: str) -> Path:
    """Where the machine's own table for `device` lives."""
    return data_dir() / TABLES / f"{device_slug(device)}.json"


def misses_path(device: str) -> Path:
    """Where the keys the runtime met untuned on `device` are recorded."""
    return data_dir() / MISSES / f"{device_slug(device)}.json"


@contextlib.contextmanager
def locked(path: Path, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the exclusive lock of `path` (on `<path>.lock`, made with its folder where missing).
    TimeoutError where another process holds it longer than `timeout_s`; OSError where the
    folder cannot be written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path}: locked by another process for over "
                                       f"{timeout_s:g} s") from None
                time.sleep(0.005)
        yield
    finally:
        os.close(fd)  # releases the lock


def replace_file(path: Path, text: str) -> None:
    """Write `text` to `path` atomically: a file of this writer's own beside it, then
    `os.replace`."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with tmp.open("w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# ------------------------------------------------------------------------- the local tables


@dataclass(frozen=True)
class Refreshed:
    """What a refresh did to a GPU's local table."""

    device: str
    path: Path
    #: Entries written (new keys, or a key's entry replaced by another).
    written: int
    #: Entries in the table afterwards.
    entries: int


def refresh_table(tuned: Table, running: Mapping[str, str]) -> Refreshed:
    """Merge the entries of `tuned` measured on the running kernel code (`running`: kernel
    name -> its kernel hash) into the local table of `tuned.device`.

    `tuned` is what a store holds after a job, an import or a merge: per key it already is the
    store's pick, so it replaces the local table's entry at that key. Keys it lacks keep their
    entries (another store may have tuned them). A local table that does not load is replaced.
    """
    path = table_path(tuned.device)
    fresh = [e for e in tuned.entries if running.get(e.kernel) == e.kernel_hash]
    with locked(path):
        try:
            held = load(path)
        except (OSError, TableError):
            held = Table(device=tuned.device)
        if held.device != tuned.device:  # another GPU's name giving the same file name
            held = Table(device=tuned.device)
        merged = held.index()
        written = 0
        for e in fresh:
            if merged.get(e.key) != e:
                merged[e.key] = e
                written += 1
        if written or not path.exists():
            table = replace(held, env=tuned.env, copy_gbps=tuned.copy_gbps or held.copy_gbps,
                            entries=list(merged.values()))
            replace_file(path, dumps(table))
    return Refreshed(tuned.device, path, written, len(merged))


@dataclass(frozen=True)
class LocalTable:
    """One local table file, as `kerneltune tables` lists it."""

    path: Path
    #: The table, or None where the file does not load (`error` says why).
    table: Table | None
    error: str | None = None

    @property
    def device(self) -> str:
        return self.table.device if self.table else self.path.stem

    def current(self, running: Mapping[str, str]) -> list[Entry]:
        """Its entries measured on the running kernel code."""
        entries: Iterable[Entry] = self.table.entries if self.table else ()
        return [e for e in entries if running.get(e.kernel) == e.kernel_hash]


def local_tables() -> list[LocalTable]:
    """Every local table in the data directory, by file name."""
    folder = data_dir() / TABLES
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            found.append(LocalTable(path, load(path)))
        except (OSError, TableError) as e:
            found.append(LocalTable(path, None, str(e)))
    return found


def remove_table(device: str) -> Path | None:
    """Delete the local table of `device` (a GPU name, or the slug its file is named by);
    its path, or None where there is none."""
    path = data_dir() / TABLES / f"{device_slug(device)}.json"
    with locked(path):
        if not path.is_file():
            return None
        path.unlink()  # the lock file stays: a waiting writer holds it open
    return path
