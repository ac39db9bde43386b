"""Devices and results: race-free writes (one atomic upsert per result) and lookups.

Nothing here commits: the caller owns the transaction (`with Session.begin(): ...`, or
`run_transaction`, which runs it again when the database aborts it for a conflict). Every write
is a single `INSERT ... ON CONFLICT` statement, so concurrent workers on PostgreSQL or SQLite
never see an IntegrityError and a slower result never replaces a faster one of the same kernel
code (unless the writer timed the two configs side by side and names the row it supersedes);
across code, the running code's result wins.

Writes cannot deadlock. On PostgreSQL a transaction takes its device's write lock (a
transaction-scoped advisory lock) before it writes the device's row or results, so writers of
one device queue instead of locking result rows in opposite orders: two requests upserting the
same keys in different orders used to abort each other. (SQLite has a single writer anyway.)
`upsert_results`, the write of many entries, also goes in one fixed order, the key's.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any

from sqlalchemy import BigInteger, Insert, Table, bindparam, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from kerneltune.storage._models import (
    ENV_FIELDS,
    RESULT_KEY,
    Device,
    Result,
    utcnow,
)
from kerneltune.table import Entry, Env, TableError, m_bucket, table_from_dict, table_to_dict
from kerneltune.table import Table as TuningTable

_devices: Table = Device.__table__  # type: ignore[assignment]
_results: Table = Result.__table__  # type: ignore[assignment]
_FINGERPRINT_BITS = 40  # sums of 2**23 rows still fit a signed 64-bit integer (SQLite's SUM)
# The advisory locks' first key (ASCII "ktdw"): the two-key space, apart from the migrations'.
_DEVICE_LOCK_SPACE = int.from_bytes(b"ktdw", "big")
_DEVICE_LOCK = text("SELECT pg_advisory_xact_lock(:space, :device)")
_HELD_LOCKS = "kerneltune_device_locks"


class UnknownDeviceError(LookupError):
    """No result or run was ever stored for this GPU model."""


_INSERTS = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}


def _dialect(session: Session) -> str:
    name = session.get_bind().dialect.name
    if name not in _INSERTS:
        raise NotImplementedError(f"the store supports SQLite and PostgreSQL, not {name}")
    return name


def insert_for(session: Session, table: Table) -> Insert:
    """The dialect's INSERT, which knows ON CONFLICT (SQLite and PostgreSQL)."""
    return _INSERTS[_dialect(session)](table)


# --------------------------------------------------------------------------- devices


def lock_device(session: Session, device_id: int) -> None:
    """Take `device_id`'s write lock for the rest of the session's transaction (PostgreSQL; a
    no-op on SQLite, whose writers are serialised by the database). Taken once per transaction:
    every write of a device's row or results takes it before it locks a row, so two writers
    of the same device never hold rows the other waits for."""
    if session.get_bind().dialect.name != "postgresql":
        return
    transaction = session.get_transaction()
    held = session.info.get(_HELD_LOCKS)
    if held is None or transaction is None or held[0] is not transaction:
        held = session.info[_HELD_LOCKS] = (transaction, set())
    if device_id not in held[1]:
        session.execute(_DEVICE_LOCK, {"space": _DEVICE_LOCK_SPACE, "device": device_id})
        held[1].add(device_id)


def device_id(session: Session, name: str) -> int | None:
    return session.execute(select(_devices.c.id).where(_devices.c.name == name)).scalar()


def upsert_device(
    session: Session,
    name: str,
    *,
    compute_capability: str | None = None,
    sm_count: int | None = None,
    copy_gbps: float | None = None,
) -> int:
    """The id of the device row for `name`, created if missing. Attributes given (not None)
    are stored and mark the device as seen now."""
    if not name or not name.strip():
        raise ValueError("device name must not be empty")
    attributes = {
        k: v
        for k, v in (
            ("compute_capability", compute_capability),
            ("sm_count", sm_count),
            ("copy_gbps", copy_gbps),
        )
        if v is not None
    }
    now = utcnow()
    found = device_id(session, name)
    if found is None:
        # Another worker may insert the same name meanwhile: DO NOTHING, then read its row.
        stmt = insert_for(session, _devices).values(
            name=name, first_seen=now, last_seen=now, **attributes
        )
        found = session.execute(
            stmt.on_conflict_do_nothing(index_elements=["name"]).returning(_devices.c.id)
        ).scalar()
        if found is not None:
            lock_device(session, found)
            return found
        found = session.execute(select(_devices.c.id).where(_devices.c.name == name)).scalar_one()
    lock_device(session, found)
    if attributes:
        session.execute(
            update(_devices).where(_devices.c.id == found).values(last_seen=now, **attributes)
        )
    return found


def list_devices(session: Session) -> list[Device]:
    return list(
        session.scalars(
            select(Device).order_by(Device.name).execution_options(populate_existing=True)
        )
    )


# --------------------------------------------------------------------------- writes


def validated_entry(entry: Entry) -> Entry:
    """The entry as the table format accepts it (raises `TableError`, a ValueError, otherwise),
    with an all-empty env normalised to None, as the store reads it back."""
    doc = table_to_dict(TuningTable(device="-", entries=[entry]))
    checked = table_from_dict(doc).entries[0]
    return replace(checked, env=None if checked.env == Env() else checked.env)


def fingerprint(entry: Entry) -> int:
    """A 40-bit hash of everything an entry holds; a table's fingerprint is their sum."""
    text = json.dumps(asdict(entry), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - _FINGERPRINT_BITS)


def _result_values(
    device_id: int, entry: Entry, run_id: int | None, supersedes: int | None = None,
    running_hash: str | None = None,
) -> dict[str, Any]:
    env = entry.env or Env()
    return {
        "device_id": device_id,
        "kernel": entry.kernel,
        "dtype": entry.dtype,
        "n": entry.n,
        "m": entry.m,
        "config": entry.config,
        "us": entry.us,
        "gbps": entry.gbps,
        "frac_copy": entry.frac_copy,
        "default_us": entry.default_us,
        "default_config": entry.default_config,
        "trials": entry.trials,
        "kernel_hash": entry.kernel_hash,
        **{f: getattr(env, f) for f in ENV_FIELDS},
        "run_id": run_id,
        "fingerprint": fingerprint(entry),
        "updated_at": utcnow(),
        "supersedes": supersedes,
        "running_hash": running_hash or entry.kernel_hash,
    }


@functools.cache
def _upsert_statement(dialect: str) -> Insert:
    """INSERT ... ON CONFLICT (key) DO UPDATE ... WHERE faster on the same code, on the running
    code where the stored row's is other, or the superseded row; built once per dialect
    (building it costs more than running it) and executed with each row's values."""
    stmt = _INSERTS[dialect](_results)
    new, stored = stmt.excluded, _results.c
    same_code = stored.kernel_hash == new.kernel_hash
    return stmt.on_conflict_do_update(
        index_elements=list(RESULT_KEY),
        set_={c.name: new[c.name] for c in _results.c if c.name not in ("id", *RESULT_KEY)},
        # Keep the faster config measured on the same kernel code. A row of other code gives
        # way to one of the running code only: a stale entry, however fast, never replaces a
        # result the runtime can use. And the row the writer timed beside its own gives way
        # (no match when it names none: NULL).
        where=(same_code & (new.us < stored.us))
        | (~same_code & (new.kernel_hash == bindparam("running_hash")))
        | (stored.fingerprint == bindparam("supersedes", type_=BigInteger)),
    ).returning(stored.id)


def upsert_result_for_id(
    session: Session, device_id: int, entry: Entry, *, run_id: int | None = None,
    supersedes: int | None = None, running_hash: str | None = None,
) -> bool:
    """`upsert_result` for a known device id (saves the device lookup in bulk imports)."""
    entry = validated_entry(entry)
    if not entry.us > 0:
        raise TableError(f"measured time must be positive, got {entry.us} us")
    stmt = _upsert_statement(_dialect(session))
    values = _result_values(device_id, entry, run_id, supersedes, running_hash)
    lock_device(session, device_id)
    return session.execute(stmt, values).first() is not None


def upsert_result(
    session: Session, device: str, entry: Entry, *, run_id: int | None = None,
    supersedes: int | None = None, running_hash: str | None = None,
) -> bool:
    """Store `entry` for `device` if its key has no result yet, if it is faster than a stored
    one measured on the same kernel code, if the stored one was measured on other code and
    `entry` on the running code, or if the stored one's fingerprint is `supersedes`.

    `running_hash` is the kernel hash of the code that will use the result; None takes the
    entry's own, as for a tuner, which measures the code it runs. A writer of entries from
    elsewhere (an import, a remote worker) names it, so that an entry of older (or newer) code
    never replaces a result the runtime can use. A tuner that re-timed the stored row's config
    beside `entry`'s and picked `entry` names that row in `supersedes`: one config's times from
    two runs (other hosts, inputs, clocks) are no fair contest, the side-by-side verdict is.
    One atomic statement: a concurrent slower write never replaces a faster one, and a row
    written since the caller read it is not the one it supersedes.

    Returns True when this call wrote the row (inserted or replaced), False when the stored
    result was kept. Raises `kerneltune.table.TableError` (a ValueError) for an invalid entry.
    """
    return upsert_result_for_id(session, upsert_device(session, device), entry, run_id=run_id,
                                supersedes=supersedes, running_hash=running_hash)


def upsert_results(
    session: Session, device: str, entries: Sequence[Entry], *,
    copy_gbps: float | None = None, run_id: int | None = None,
    running_hashes: Mapping[str, str] | None = None,
) -> list[bool]:
    """`upsert_result` for each of `entries` of `device` (and its copy bandwidth, if given),
    written in key order (kernel, dtype, n, m) whatever the order given: every multi-row
    writer then locks rows in one order. `running_hashes` gives the running code's kernel hash
    by kernel name. Returns, in the order given, whether each entry was written."""
    found = upsert_device(session, device, copy_gbps=copy_gbps)
    running = running_hashes or {}
    written = [False] * len(entries)
    for i in sorted(range(len(entries)), key=lambda i: entries[i].key):
        entry = entries[i]
        written[i] = upsert_result_for_id(session, found, entry, run_id=run_id,
                                          running_hash=running.get(entry.kernel))
    return written


# --------------------------------------------------------------------------- reads


def _select_results(device: str, kernel: str | None, dtype: str | None) -> Any:
    stmt = (
        select(Result)
        .join(Device, Result.device_id == Device.id)
        .where(Device.name == device)
        .execution_options(populate_existing=True)  # rows may have changed under an upsert
    )
    if kernel is not None:
        stmt = stmt.where(Result.kernel == kernel)
    if dtype is not None:
        stmt = stmt.where(Result.dtype == dtype)
    return stmt


def results_for(
    session: Session, device: str, kernel: str | None = None, dtype: str | None = None,
    *, n: int | None = None, kernel_hash: str | None = None,
) -> list[Result]:
    """A device's results, optionally of one kernel, dtype, N and kernel code, in table
    order."""
    stmt = _select_results(device, kernel, dtype)
    if n is not None:
        stmt = stmt.where(Result.n == n)
    if kernel_hash is not None:
        stmt = stmt.where(Result.kernel_hash == kernel_hash)
    return list(session.scalars(stmt.order_by(Result.kernel, Result.dtype, Result.n, Result.m)))


def get_result(
    session: Session,
    device: str,
    kernel: str,
    dtype: str,
    n: int,
    m: int,
    *,
    kernel_hash: str | None = None,
) -> Result | None:
    """The result for exactly this key (`m` is a row count or its bucket). With `kernel_hash`,
    a result measured on other code counts as missing."""
    stmt = _select_results(device, kernel, dtype).where(
        Result.n == n, Result.m == m_bucket(m)
    )
    if kernel_hash is not None:
        stmt = stmt.where(Result.kernel_hash == kernel_hash)
    return session.scalars(stmt).first()


def entries_for(session: Session, device: str, kernel: str | None = None) -> list[Entry]:
    """A device's results, optionally of one kernel, as table entries in table order: the
    table a config lookup resolves over (`kerneltune.resolution.resolve`), stale ones included
    (the resolution passes them over)."""
    return [r.to_entry() for r in results_for(session, device, kernel)]
