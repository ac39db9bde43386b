"""GPU models as the service knows them: found by driver name or slug, summarised for listings."""

from __future__ import annotations

from fastapi import HTTPException, status
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from kerneltune.api.schemas import GpuInfo
from kerneltune.storage import Result, list_devices
from kerneltune.table import device_slug


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
