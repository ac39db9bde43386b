"""A tuning process killed halfway, then restarted: same keys, and in the store each config of
a key measured once (the key in flight when the process died is searched again)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from kerneltune import storage
from kerneltune.table import INTERPRETER_DEVICE
from kerneltune.tuner.search import measured, outcome_of

from .conftest import (
    assert_no_duplicate_measurements,
    results_count,
    small_job,
    started_job,
    tune_command,
)

# Eight keys: a key takes a fraction of a second here, so fewer could all be done before
# the kill lands.
JOB = small_job(dtypes=["float32"], m_buckets=[1, 4, 16, 64])


@pytest.mark.slow
def test_killed_job_resumes_without_repeating_trials(sqlite_url, stored_factory):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = started_job(JOB, sqlite_url)
    engine = storage.make_engine(sqlite_url)
    try:
        time.sleep(0.1)  # into the next key's trials
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        killed_with = results_count(engine)
    finally:
        proc.stderr.close()
    keys = JOB.keys(INTERPRETER_DEVICE)
    assert 1 <= killed_with < len(keys)

    done = subprocess.run(tune_command(JOB, sqlite_url), env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert results_count(engine) == len(keys)
    engine.dispose()

    stored = stored_factory(sqlite_url)
    spec = JOB.specs()["rmsnorm_fwd"]
    interrupted = 0
    for key in keys:
        trials = stored.trials(key, spec)
        assert_no_duplicate_measurements(trials)
        n_valid = sum(1 for _ in spec.configs(key.problem()))
        assert len(measured(trials)) == min(JOB.trials, n_valid)
        assert stored.study_attrs(key, spec)["done"]
        assert stored.entry(key) is not None
        interrupted += sum(outcome_of(t) == "interrupted" for t in trials)
    assert interrupted == 0  # the killed search's trials never reached the store
