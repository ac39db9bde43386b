from __future__ import annotations

import pytest

from kerneltune.storage import (
    RunStatus,
    TuningRun,
    finish_run,
    latest_run,
    start_run,
    update_run,
    upsert_device,
    upsert_result,
)
from kerneltune.table import Env

from .conftest import GPU, make_entry

ENV = Env(triton="3.6.0", torch="2.11.0+cu130", cuda="13.0", driver="580.1", python="3.12.3")


def test_run_lifecycle(Session):
    with Session.begin() as session:
        run_id = start_run(session, device=GPU, env=ENV, sampler="tpe", trials_per_key=40,
                           time_budget_s=600.0, host="node7", worker="gpu3", keys_total=2)
        upsert_result(session, GPU, make_entry(10.0), run_id=run_id)
        update_run(session, run_id, keys_done=1, trials=40)
    with Session() as session:
        run = session.get(TuningRun, run_id)
        assert run.status is RunStatus.running and run.finished_at is None
        assert (run.host, run.worker, run.keys_total, run.keys_done) == ("node7", "gpu3", 2, 1)
        assert run.user  # defaults to this process's user
        assert run.env == ENV and run.device.name == GPU
    with Session.begin() as session:
        finish_run(session, run_id, "interrupted", keys_done=1, keys_failed=1, trials=57,
                   trials_pruned=3)
    with Session() as session:
        run = session.get(TuningRun, run_id)
        assert run.status is RunStatus.interrupted
        assert run.finished_at is not None
        assert (run.keys_done, run.keys_failed, run.trials, run.trials_pruned) == (1, 1, 57, 3)


def test_finish_run_checks_its_arguments(Session):
    with Session.begin() as session:
        run_id = start_run(session, device=GPU, env=ENV, sampler="brute", trials_per_key=None,
                           time_budget_s=None)
    with Session.begin() as session:
        with pytest.raises(ValueError):
            finish_run(session, run_id, "exploded")
        with pytest.raises(ValueError):
            finish_run(session, run_id, RunStatus.running)
        with pytest.raises(TypeError, match="keys_done"):
            finish_run(session, run_id, "done", keys_doen=3)
        with pytest.raises(LookupError):
            finish_run(session, run_id + 1000, "done")
        finish_run(session, run_id, RunStatus.failed)
    with Session() as session:
        assert session.get(TuningRun, run_id).status is RunStatus.failed


def test_latest_run_is_the_last_started(Session):
    with Session.begin() as session:
        first = start_run(session, device=GPU, env=Env(torch="1"), sampler="tpe",
                          trials_per_key=1, time_budget_s=None)
        second = start_run(session, device=GPU, env=Env(torch="2"), sampler="tpe",
                           trials_per_key=1, time_budget_s=None)
        device_id = upsert_device(session, GPU)
        assert first != second
        assert latest_run(session, device_id).id == second
        assert latest_run(session, upsert_device(session, "other GPU")) is None
