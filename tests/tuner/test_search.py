"""The search runs on an in-memory copy of the key's study: what it measured is in the store
when it stops, and a later search goes on from there."""

from __future__ import annotations

import pytest
from sqlalchemy import event

from kerneltune.table import INTERPRETER_DEVICE
from kerneltune.tuner.job import Job
from kerneltune.tuner.runner import open_stores
from kerneltune.tuner.search import KeySearch, config_id, measured
from kerneltune.tuner.worker import BenchmarkWorker

from .conftest import assert_no_duplicate_measurements

JOB = Job(kernels=["rmsnorm_fwd"], ns=[64], dtypes=["float32"], m_buckets=[4], trials=5)


@pytest.fixture(scope="module")
def worker():
    with BenchmarkWorker(interpret=True, name="test-search") as w:
        yield w


def test_a_stopped_search_leaves_its_trials_in_the_store_and_the_next_goes_on(
        sqlite_url, worker, stored_factory):
    (key,) = JOB.keys(INTERPRETER_DEVICE)
    spec = JOB.specs()[key.spec_ref]
    engine, studies = open_stores(sqlite_url)
    statements: list[str] = []
    event.listen(studies.engine, "before_cursor_execute",
                 lambda *args: statements.append(args[2]))

    ran, statements_at = [], []

    def on_trial(key, trial, best):
        ran.append(trial)
        statements_at.append(len(statements))

    state = KeySearch(JOB, key, spec, studies, worker, on_trial=on_trial,
                      should_stop=lambda: len(ran) >= 2).search()
    assert state.counted == 2 and not state.exhausted
    # Trials are written when the search ends, not one statement at a time as they run.
    assert statements_at[0] == statements_at[-1]

    stored = stored_factory(sqlite_url)
    after_stop = stored.trials(key, spec)
    assert [config_id(t.params) for t in measured(after_stop)] == [
        config_id(t.params) for t in ran]
    assert after_stop[0].params == spec.default(key.problem())  # the default goes first

    resumed = KeySearch(JOB, key, spec, studies, worker).search()
    assert resumed.counted == JOB.trials
    trials = stored.trials(key, spec)
    assert_no_duplicate_measurements(trials)
    assert len(measured(trials)) == JOB.trials
    assert [t.number for t in trials] == list(range(len(trials)))
    engine.dispose()
    studies.remove_session()
