"""GPU models as the service knows them: found by driver name or slug, summarised for listings,
and each one's table rendered once per version of its rows."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException, status
from sqlalchemy import ColumnElement, ScalarSelect, Select, Table, bindparam, func, select
from sqlalchemy.orm import Session

from kerneltune.api.schemas import GpuInfo
from kerneltune.storage import (
    Device,
    Result,
    TuningRun,
    UnknownDeviceError,
    export_table,
    list_devices,
    table_etag,
)
from kerneltune.table import device_slug, dumps

#: zlib level of the tables' compressed bodies (made once per version of a table).
GZIP_LEVEL = 6


def _slug(name: str) -> str:
    try:
        return device_slug(name)
    except ValueError:  # a name without letters or digits has no slug
        return ""


class DeviceNames:
    """GPU model names by themselves and by slug, read from the store again whenever a name is
    not found, so a GPU that appears is known at once. (Names are never renamed or removed, so
    a name found here is still in the store.) Saves a query on every lookup."""

    def __init__(self) -> None:
        self._names: dict[str, str] = {}

    def resolve(self, session: Session, gpu: str) -> str:
        """The stored name for `gpu` (a driver's name, or its slug); 404 naming the known ones."""
        name = self._names.get(gpu) or self._names.get(gpu.strip().lower())
        if name is not None:
            return name
        devices = list_devices(session)
        names: dict[str, str] = {}
        for d in devices:
            names[_slug(d.name)] = names[d.name.lower()] = d.name
        for d in devices:  # exact names win over another device's slug or lower-case form
            names[d.name] = d.name
        names.pop("", None)
        self._names = names
        name = names.get(gpu) or names.get(gpu.strip().lower())
        if name is not None:
            return name
        known = ", ".join(repr(d.name) for d in devices) or "none yet"
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, f"unknown GPU {gpu!r}; known GPUs: {known}"
        )


def gpu_infos(session: Session) -> list[GpuInfo]:
    """Every stored GPU model with its entry count, tuned kernels and copy bandwidth."""
    # One grouped count (the store has no per-device summary function).
    counts: dict[int, dict[str, int]] = {}
    rows = session.execute(
        select(Result.device_id, Result.kernel, func.count()).group_by(
            Result.device_id, Result.kernel
        )
    )
    for device_id, kernel, count in rows:
        counts.setdefault(device_id, {})[kernel] = count
    return [
        GpuInfo(
            name=d.name,
            slug=_slug(d.name),
            entries=sum(counts.get(d.id, {}).values()),
            copy_gbps=d.copy_gbps,
            kernels=sorted(counts.get(d.id, {})),
        )
        for d in list_devices(session)
    ]


# --------------------------------------------------------------------------- tables


def _table_version() -> Select:
    """One statement, built once, that reads what a device's table is made of: its result rows
    (count and the sum of their content fingerprints, an index-only scan), its copy bandwidth
    and its runs (count and newest id: the table's environment is its latest run's)."""
    devices: Table = Device.__table__  # type: ignore[assignment]
    results: Table = Result.__table__  # type: ignore[assignment]
    runs: Table = TuningRun.__table__  # type: ignore[assignment]
    of_device = devices.c.id

    def scalar(column: ColumnElement[Any], table: Table) -> ScalarSelect[Any]:
        return (select(column).select_from(table).where(table.c.device_id == of_device)
                .correlate(devices).scalar_subquery())

    return select(
        devices.c.copy_gbps,
        scalar(func.count(), results),
        scalar(func.coalesce(func.sum(results.c.fingerprint), 0), results),
        scalar(func.count(), runs),
        scalar(func.max(runs.c.id), runs),
    ).where(devices.c.name == bindparam("device"))


_TABLE_VERSION = _table_version()


@dataclass(frozen=True)
class TableState:
    """A device's table as the service sends it: the body, compressed and not, and its tag."""

    version: tuple
    tag: str  # the store's fingerprint of the table (`table_etag`), unquoted
    body: bytes
    gzipped: bytes


class TableStates:
    """Each device's rendered table and ETag, kept while the device's version (one cheap
    statement) is unchanged: any write to its results, its copy bandwidth or its runs, from any
    process, changes the version and so drops what is kept. A request for an unchanged table,
    304 or 200, costs that one statement: no fingerprint sum over the whole table, no export,
    no serialisation, no compression."""

    def __init__(self) -> None:
        self._states: dict[str, TableState] = {}
        self._lock = threading.Lock()

    def current(self, session: Session, device: str) -> TableState | None:
        """The device's table as it is now; None where the device is not in the store."""
        while True:
            version = self._version(session, device)
            if version is None:
                return None
            kept = self._states.get(device)
            if kept is not None and kept.version == version:
                return kept
            tag = table_etag(session, device)
            try:
                body = dumps(export_table(session, device)).encode()
            except UnknownDeviceError:
                return None
            # A write between the version and the export would pair a newer body with an older
            # version (and tag): keep it only if nothing changed meanwhile.
            if tag is not None and self._version(session, device) == version:
                state = TableState(version, tag, body,
                                   gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0))
                with self._lock:
                    self._states[device] = state
                return state
            session.rollback()  # see the newer state on the next round

    @staticmethod
    def _version(session: Session, device: str) -> tuple | None:
        row = session.execute(_TABLE_VERSION, {"device": device}).first()
        return None if row is None else tuple(row)
