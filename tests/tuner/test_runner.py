"""Tuning jobs end to end under the Triton interpreter, against a real SQLite file."""

from __future__ import annotations

import json
import sqlite3
import statistics
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from kerneltune import storage, table
from kerneltune.kernels import KernelSpec
from kerneltune.table import INTERPRETER_DEVICE
from kerneltune.tuner.job import Job
from kerneltune.tuner.runner import JobRunner, open_stores
from kerneltune.tuner.search import Pick, config_id, measured, outcome_of
from kerneltune.tuner.select import Measured

from .conftest import Stored, assert_no_duplicate_measurements, small_job
from .faulty_kernels import WRONG_CONFIG


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """One small job run to completion: (job, url, report)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('tuned') / 'kerneltune.db'}"
    job = small_job()
    report = JobRunner(job, url, workers=1).run()
    return job, url, report


def test_job_tunes_every_key(tuned):
    job, _url, report = tuned
    assert report.device == INTERPRETER_DEVICE
    assert report.status == "done"
    assert [r.key for r in report.keys] == job.keys(INTERPRETER_DEVICE)
    assert {r.status for r in report.keys} == {"tuned"}, [(r.key, r.reason) for r in report.keys]


def test_studies_hold_every_trial_and_the_result_its_best(tuned):
    job, url, report = tuned
    stored = Stored(url)
    try:
        specs = job.specs()
        assert len(stored.study_names()) == len(report.keys)
        for r in report.keys:
            spec = specs[r.key.spec_ref]
            problem = r.key.problem()
            trials = stored.trials(r.key, spec)
            done = measured(trials)
            n_valid = sum(1 for _ in spec.configs(problem))
            assert len(done) == min(job.trials, n_valid)
            assert_no_duplicate_measurements(trials)
            assert trials[0].params == spec.default(problem).to_json()  # tried first
            for t in trials:
                if outcome_of(t) == "ok":
                    assert t.user_attrs["method"] == "interpreter"
                    assert t.value == t.user_attrs["median_us"] > 0
                else:
                    assert t.user_attrs["reason"]
            attrs = stored.study_attrs(r.key, spec)
            assert attrs["done"]["budget"] == len(done)
            finalists = attrs["done"]["finalists"]
            assert spec.default(problem).to_json() in [f["config"] for f in finalists]
            tried = [t.params for t in done]
            assert all(f["config"] in tried for f in finalists)

            entry = stored.entry(r.key)
            assert entry == r.entry
            assert entry.config in [f["config"] for f in finalists]
            winner = next(f for f in finalists if f["config"] == entry.config)
            assert entry.us == statistics.median(winner["rounds_us"])
            assert entry.kernel_hash == spec.kernel_hash
            assert entry.default_config == spec.default(problem).to_json()
            assert entry.trials == len(done)
            assert entry.gbps == pytest.approx(spec.bytes_moved(problem) / (entry.us * 1e3))
            assert entry.frac_copy is None  # no copy bandwidth on a CPU
            assert entry.env is not None and entry.env.triton and entry.env.torch
    finally:
        stored.close()


def test_stored_configs_are_valid_and_correct(tuned):
    job, _url, report = tuned
    specs = job.specs()
    for r in report.keys:
        spec, problem = specs[r.key.spec_ref], r.key.problem()
        config = spec.parse(problem, r.entry.config)  # in the space, valid
        inputs = spec.make_inputs(problem, seed=12345, device="cpu")
        with torch.no_grad():
            assert spec.check(inputs, spec.run(inputs, config)) is None


def test_exported_table_loads_back_identical(tuned, tmp_path):
    _job, url, report = tuned
    engine = storage.make_engine(url)
    try:
        with storage.session_factory(engine)() as s:
            exported = storage.export_table(s, INTERPRETER_DEVICE)
    finally:
        engine.dispose()
    assert len(exported.entries) == len(report.keys)
    assert exported.index() == {r.entry.key: r.entry for r in report.keys}
    path = table.save(exported, tmp_path / "interp.json")
    assert table.load(path) == exported
    assert table.dumps(table.load(path)) == table.dumps(exported)


def test_rerun_skips_done_keys_without_new_trials(tuned, stored_factory):
    job, url, report = tuned
    stored = stored_factory(url)
    specs = job.specs()
    before = {r.key: len(stored.trials(r.key, specs[r.key.spec_ref])) for r in report.keys}
    again = JobRunner(job, url, workers=1).run()
    assert again.status == "done"
    assert {r.status for r in again.keys} == {"done"}
    assert {r.key: r.entry for r in again.keys} == {r.key: r.entry for r in report.keys}
    after = {r.key: len(stored.trials(r.key, specs[r.key.spec_ref])) for r in report.keys}
    assert after == before


def test_a_rerun_finds_its_keys_done_without_listing_their_spaces(tuned, monkeypatch, tmp_path):
    # Listing a long row's space takes about a second: a job of many done keys spent its time
    # budget checking them. A key done with the job's trials is done without it.
    job, url, _report = tuned
    listed = []
    configs = KernelSpec.configs
    monkeypatch.setattr(KernelSpec, "configs",
                        lambda spec, problem: listed.append(problem) or configs(spec, problem))
    copy = copy_store(url, tmp_path / "copy.db")
    again = JobRunner(job, f"sqlite:///{copy}", workers=1).run()
    assert {r.status for r in again.keys} == {"done"}
    assert listed == []
    # Asked for more trials than they were done with, they are searched again.
    more = JobRunner(replace(job, trials=job.trials + 1), f"sqlite:///{copy}", workers=1).run()
    assert {r.status for r in more.keys} == {"tuned"}
    assert {r.trials for r in more.keys} == {job.trials + 1}
    assert listed


def test_a_search_stores_its_pick_over_an_entry_it_retimed_though_that_was_faster(tuned,
                                                                                   tmp_path):
    # A stored time from an earlier run (another host, other clocks) is no opponent for a
    # re-timing that ran the stored config beside the others: the new verdict is stored.
    job, url, report = tuned
    copy = copy_store(url, tmp_path / "copy.db")
    with closing(sqlite3.connect(copy)) as db, db:
        db.execute("UPDATE results SET us = us / 1000")
    more = JobRunner(replace(job, trials=job.trials + 1), f"sqlite:///{copy}", workers=1).run()
    assert {r.status for r in more.keys} == {"tuned"}
    assert {r.entry.trials for r in more.keys} == {job.trials + 1}
    for r in more.keys:
        stored = next(e for e in report.keys if e.key == r.key).entry
        assert r.entry.us > stored.us / 100  # this run's time, not the planted one


def padded_job(trials: int) -> Job:
    """One key of a kernel whose configs all pass, every one within reach of the re-timing."""
    return Job(kernels=["tuner.faulty_kernels:PADDED_SPEC"], ns=[24], dtypes=["float32"],
               m_buckets=[2], trials=trials, retime_rounds=2, retime_top=2, retime_within=100.0,
               compile_timeout_s=60, run_timeout_s=30)


def test_a_stored_pick_that_fails_its_re_timing_gives_way_though_it_was_faster(
        sqlite_url, stored_factory, monkeypatch):
    # The key's last pick is among the next search's finalists; it now runs wrong, so the new
    # pick replaces it, though the stored time (planted a thousand times faster) would keep it.
    first = JobRunner(padded_job(3), sqlite_url, workers=1).run()
    (tuned,) = first.keys
    assert tuned.status == "tuned", tuned.reason
    before = tuned.entry.config
    with closing(sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))) as db, db:
        db.execute("UPDATE results SET us = us / 1000")
    monkeypatch.setenv(WRONG_CONFIG, json.dumps(before, sort_keys=True))

    again = JobRunner(padded_job(4), sqlite_url, workers=1).run()
    (result,) = again.keys
    assert result.status == "tuned", result.reason
    assert result.entry.config != before
    assert result.entry.us > tuned.entry.us / 100  # this run's time, not the planted one
    stored = stored_factory(sqlite_url)
    assert stored.entry(result.key).config == result.entry.config
    spec = padded_job(4).specs()[result.key.spec_ref]
    failed = stored.study_attrs(result.key, spec)["done"]["failed_finalists"]
    assert "wrong output" in failed[config_id(before)]


def test_only_a_stored_config_the_pick_re_timed_is_superseded(tuned, stored_factory):
    # A faster stored entry whose config the pick did not run (imported from another host,
    # say) stays: a time from elsewhere is only replaced by a side-by-side verdict.
    job, url, report = tuned
    runner = JobRunner(job, url, workers=1)
    entry = report.keys[0].entry
    key = report.keys[0].key
    spec = job.specs()[key.spec_ref]
    picked = spec.parse(key.problem(), entry.config)
    other = picked.replace(num_warps=2 * picked.num_warps)
    with stored_factory(url).Session() as s:
        row = runner._stored_result(s, key)
        assert row is not None and config_id(row.config) == config_id(picked)
        ran = Pick(entry, None, [Measured(picked, (1.0,)), Measured(other, (1.0,))])
        dropped = Pick(None, "failed", failed={config_id(entry.config): "wrong output"})
        elsewhere = Pick(entry, None, [Measured(other, (1.0,))])
        assert runner._retimed_result(s, key, ran) == row.fingerprint
        assert runner._retimed_result(s, key, dropped) == row.fingerprint
        assert runner._retimed_result(s, key, elsewhere) is None


def copy_store(url: str, copy: Path) -> Path:
    """A copy of an SQLite store (in WAL mode: a file copy could miss the latest writes)."""
    with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as src, \
            closing(sqlite3.connect(copy)) as dst:
        src.backup(dst)
    return copy


def test_optuna_shares_the_stores_sqlite_settings(tmp_path):
    """Optuna's own engine on the store: the same busy timeout, and commits without an fsync
    each (several a trial)."""
    engine, studies = open_stores(f"sqlite:///{tmp_path / 'kerneltune.db'}")
    try:
        with studies.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
    finally:
        studies.engine.dispose()
        engine.dispose()


def test_a_store_refusing_a_keys_trials_fails_the_job_and_frees_the_key(tmp_path, caplog):
    """The study writer's failure path: the job stops and says it failed, the error is logged,
    and the key's claim is released all the same (no worker is left locked out of it)."""
    from sqlalchemy import text

    from kerneltune.tuner import claims
    from kerneltune.tuner.runner import Progress
    from kerneltune.tuner.search import study_name

    url = f"sqlite:///{tmp_path / 'kerneltune.db'}"
    job = small_job(ns=[16], dtypes=["float32"], m_buckets=[1, 4])

    class RefuseTrials(Progress):
        def key_started(self, key, lane):
            with runner.engine.begin() as conn:
                conn.execute(text("CREATE TRIGGER IF NOT EXISTS refuse BEFORE INSERT ON trials "
                                  "BEGIN SELECT RAISE(ABORT, 'the disk is full'); END"))

    runner = JobRunner(job, url, workers=1, progress=RefuseTrials())
    report = runner.run()
    assert report.status == "failed"
    assert "the disk is full" in caplog.text
    first = job.keys(INTERPRETER_DEVICE)[0]
    spec = job.specs()[first.spec_ref]
    assert claims.holder(runner.engine, study_name(first, spec.kernel_hash)) is None
    assert report.keys[0].status == "tuned"  # its result row went in before the writer ran
