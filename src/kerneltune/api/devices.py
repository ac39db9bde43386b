"""GPU models as the service knows them: found by driver name or slug, summarised for listings."""

from __future__ import annotations

from fastapi import HTTPException, status
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from kerneltune.api.schemas import GpuInfo
from kerneltune.storage import Device, Result, list_devices
from kerneltune.table import device_slug


def _slug(name: str) -> str:
    try:
        return device_slug(name)
    except ValueError:  # a name without letters or digits has no slug
        return ""


def resolve_device(session: Session, gpu: str) -> Device:
    """The stored device named `gpu` (the driver's name, or its slug); 404 naming the known ones."""
    devices = list_devices(session)
    for device in devices:
        if device.name == gpu:
            return device
    wanted = gpu.strip().lower()
    for device in devices:
        if wanted in (device.name.lower(), _slug(device.name)):
            return device
    known = ", ".join(repr(d.name) for d in devices) or "none yet"
    raise HTTPException(status.HTTP_404_NOT_FOUND, f"unknown GPU {gpu!r}; known GPUs: {known}")


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
