"""Two tuning processes sharing one PostgreSQL store: each key tuned once, nothing lost."""

from __future__ import annotations

import os
import subprocess

import pytest
from sqlalchemy import select

from kerneltune import storage
from kerneltune.table import INTERPRETER_DEVICE
from kerneltune.tuner.search import measured
from kerneltune.tuner.select import Measured, canonical_order, is_tie, pick_winner

from .conftest import assert_no_duplicate_measurements, outcomes, small_job, tune_command

JOB = small_job(dtypes=["float32"])


@pytest.mark.slow
@pytest.mark.postgres
def test_two_processes_share_the_keys(pg_url, stored_factory):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    command = tune_command(JOB, pg_url)
    procs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=400) for p in procs]
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err[-3000:]
        assert "IntegrityError" not in out + err
        assert "Traceback" not in err

    stored = stored_factory(pg_url)
    spec = JOB.specs()["rmsnorm_fwd"]
    keys = JOB.keys(INTERPRETER_DEVICE)
    with stored.Session() as s:
        runs = s.scalars(select(storage.TuningRun)).all()
        results = s.scalars(select(storage.Result)).all()
    assert len(runs) == 2 and {r.status for r in runs} == {storage.RunStatus.done}
    assert len(results) == len(keys)
    assert {r.run_id for r in results} <= {r.id for r in runs}
    for key in keys:
        trials = stored.trials(key, spec)
        problem = key.problem()
        n_valid = sum(1 for _ in spec.configs(problem))
        # tuned once: one search's worth of measurements, none repeated, none interrupted
        assert len(measured(trials)) == min(JOB.trials, n_valid)
        assert_no_duplicate_measurements(trials)
        assert "interrupted" not in outcomes(trials)
        # the stored best is the pick from what the workers measured
        done = stored.study_attrs(key, spec)["done"]
        assert done["by"].endswith("gpu interpreter") and done["started"] <= done["at"]
        finalists = [Measured(spec.parse(problem, f["config"]), tuple(f["rounds_us"]))
                     for f in done["finalists"]]
        order = canonical_order(spec.space(problem), spec.default(problem))
        winner = pick_winner(finalists, order)
        entry = stored.entry(key)
        assert entry.config == winner.config.to_json()
        assert entry.us == winner.median_us == done["us"]
        assert entry.config in [t.params for t in trials if t.state.name == "COMPLETE"]
        fastest = min(finalists, key=lambda f: f.median_us)
        assert winner is fastest or is_tie(winner, fastest)
