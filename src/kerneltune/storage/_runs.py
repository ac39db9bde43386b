"""Tuning runs: who tuned what, where, with which software, and how it ended."""

from __future__ import annotations

import getpass
import os
import socket

from sqlalchemy import select
from sqlalchemy.orm import Session

from kerneltune.storage._models import ENV_FIELDS, RUN_COUNTS, RunStatus, TuningRun, utcnow
from kerneltune.storage._results import upsert_device
from kerneltune.table import Env


def _current_user() -> str | None:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name in some containers
        return None


def start_run(
    session: Session,
    *,
    device: str,
    env: Env,
    sampler: str,
    trials_per_key: int | None,
    time_budget_s: float | None,
    host: str | None = None,
    worker: str | None = None,
    user: str | None = None,
    keys_total: int | None = None,
) -> int:
    """Record a tuning run as running and return its id. Host and user default to this
    process's; `worker` names the worker within the host (e.g. "gpu0" or a pid)."""
    device_id = upsert_device(session, device)
    run = TuningRun(
        device_id=device_id,
        started_at=utcnow(),
        host=host if host is not None else socket.gethostname(),
        user=user if user is not None else _current_user(),
        worker=worker if worker is not None else str(os.getpid()),
        sampler=sampler,
        trials_per_key=trials_per_key,
        time_budget_s=time_budget_s,
        status=RunStatus.running,
        keys_total=keys_total,
        keys_done=0,
        keys_failed=0,
        trials=0,
        trials_pruned=0,
        **{f: getattr(env, f) for f in ENV_FIELDS},
    )
    session.add(run)
    session.flush()
    return run.id


def _get_run(session: Session, run_id: int) -> TuningRun:
    run = session.get(TuningRun, run_id, populate_existing=True)
    if run is None:
        raise LookupError(f"no tuning run with id {run_id}")
    return run


def _set_counts(run: TuningRun, counts: dict[str, int | None]) -> None:
    unknown = set(counts) - set(RUN_COUNTS)
    if unknown:
        raise TypeError(f"unknown run counts {sorted(unknown)}; known: {list(RUN_COUNTS)}")
    for name, value in counts.items():
        if value is not None:
            setattr(run, name, int(value))


def update_run(session: Session, run_id: int, **counts: int | None) -> None:
    """Record a running run's progress (any of `RUN_COUNTS`)."""
    _set_counts(_get_run(session, run_id), counts)
    session.flush()


def finish_run(
    session: Session, run_id: int, status: RunStatus | str, **counts: int | None
) -> None:
    """Close a run with its final status ("done", "failed", "interrupted") and counts
    (any of `RUN_COUNTS`: keys_total, keys_done, keys_failed, trials, trials_pruned)."""
    status = RunStatus(status)
    if status is RunStatus.running:
        raise ValueError("finish_run needs a final status, not 'running'")
    run = _get_run(session, run_id)
    _set_counts(run, counts)
    run.status = status
    run.finished_at = utcnow()
    session.flush()


def latest_run(session: Session, device_id: int) -> TuningRun | None:
    """The run started last on a device (its environment is the table's)."""
    return session.scalars(
        select(TuningRun)
        .where(TuningRun.device_id == device_id)
        .order_by(TuningRun.started_at.desc(), TuningRun.id.desc())
        .limit(1)
        .execution_options(populate_existing=True)
    ).first()
