"""A device's results as a `kerneltune.table.Table`: export, import, and a cheap ETag."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from sqlalchemy import Table as SqlTable
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from kerneltune.storage._models import ENV_FIELDS, Device, Result, RunStatus, TuningRun, utcnow
from kerneltune.storage._results import (
    UnknownDeviceError,
    results_for,
    upsert_device,
    upsert_result_for_id,
)
from kerneltune.storage._runs import latest_run
from kerneltune.table import Env, Table

_results: SqlTable = Result.__table__  # type: ignore[assignment]
_runs: SqlTable = TuningRun.__table__  # type: ignore[assignment]
IMPORT_SAMPLER = "import"


def _device(session: Session, name: str) -> Device:
    device = session.scalars(
        select(Device).where(Device.name == name).execution_options(populate_existing=True)
    ).first()
    if device is None:
        raise UnknownDeviceError(name)
    return device


def export_table(session: Session, device: str) -> Table:
    """The device's table: every stored result, the device's copy bandwidth, and the software
    environment of its latest run (tuning or import). Raises `UnknownDeviceError`."""
    row = _device(session, device)
    run = latest_run(session, row.id)
    return Table(
        device=row.name,
        env=run.env if run is not None else Env(),
        copy_gbps=row.copy_gbps,
        entries=[r.to_entry() for r in results_for(session, device)],
        compute_capability=row.compute_capability,
    ).sorted()


def import_table(session: Session, table: Table,
                 running_hashes: Mapping[str, str] | None = None) -> int:
    """Upsert every entry of `table` (a faster stored result of the same kernel code is kept,
    as for a tuner's write; `running_hashes`, the running code's kernel hash by kernel name,
    keeps an entry of other code from replacing a result of the running code: see
    `upsert_result`) and return how many rows changed. The import is recorded as a run (sampler
    "import") that carries the table's environment, so that exporting gives it back; an import
    that changes nothing leaves no run behind unless the device had none. The table's copy
    bandwidth and compute capability, where given, replace the device's."""
    running = running_hashes or {}
    device_id = upsert_device(session, table.device, copy_gbps=table.copy_gbps,
                              compute_capability=table.compute_capability)
    had_run = latest_run(session, device_id) is not None
    now = utcnow()
    run = TuningRun(
        device_id=device_id,
        started_at=now,
        finished_at=now,
        sampler=IMPORT_SAMPLER,
        status=RunStatus.done,
        keys_total=len(table.entries),
        keys_done=0,
        keys_failed=0,
        trials=sum(e.trials for e in table.entries),
        trials_pruned=0,
        **{f: getattr(table.env, f) for f in ENV_FIELDS},
    )
    session.add(run)
    session.flush()
    changed = sum(
        upsert_result_for_id(session, device_id, entry, run_id=run.id,
                             running_hash=running.get(entry.kernel))
        for entry in table.entries
    )
    if changed or not had_run:
        run.keys_done = changed
    else:
        session.delete(run)
    session.flush()
    return changed


def table_etag(session: Session, device: str) -> str | None:
    """A token that changes exactly when `export_table(session, device)` would change; None for
    an unknown device. A bare token: HTTP wants it quoted.

    Each result row carries a 40-bit hash of its content, written in the same statement as the
    row; the token hashes their sum (an index-only scan) with the device's copy bandwidth and the
    latest run's environment, all read in one statement. Unlike max(updated_at) or a sequence
    number it does not depend on the order in which concurrent workers commit, and unlike a
    per-device revision counter it needs no row that every writer would have to lock.
    """
    devices = Device.__table__
    other = _runs.alias("other_runs")  # not the outer join's runs: no auto-correlation
    latest = (
        select(other.c.id)
        .where(other.c.device_id == devices.c.id)
        .order_by(other.c.started_at.desc(), other.c.id.desc())
        .limit(1)
        .correlate(devices)
        .scalar_subquery()
    )
    # A new row adds a (nonzero, 40-bit) fingerprint, a replaced row swaps one: the sum alone
    # moves with every change but with probability 2**-40.
    fingerprints = (
        select(func.coalesce(func.sum(_results.c.fingerprint), 0))
        .where(_results.c.device_id == devices.c.id)
        .correlate(devices)
        .scalar_subquery()
    )
    found = session.execute(
        select(
            devices.c.copy_gbps,
            devices.c.compute_capability,
            fingerprints,
            *(_runs.c[f] for f in ENV_FIELDS),
        )
        .select_from(devices.outerjoin(_runs, _runs.c.id == latest))
        .where(devices.c.name == device)
    ).first()
    if found is None:
        return None
    copy_gbps, capability, total, *env = found
    state = repr((device, copy_gbps, capability, int(total), tuple(env)))
    return hashlib.sha256(state.encode()).hexdigest()[:32]
