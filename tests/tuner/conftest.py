"""Helpers shared by the tuner's tests: reading back what a job stored."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import optuna
import pytest
from optuna.trial import FrozenTrial
from sqlalchemy import Engine, func, select

from kerneltune import storage
from kerneltune.tuner.job import Job, TuneKey
from kerneltune.tuner.runner import open_stores
from kerneltune.tuner.search import config_id, measured, outcome_of, study_name


class Stored:
    """Studies and results of a database, as the tuner left them."""

    def __init__(self, url: str) -> None:
        self.engine, self.studies = open_stores(url)
        self.Session = storage.session_factory(self.engine)

    def trials(self, key: TuneKey, spec) -> list[FrozenTrial]:
        study = optuna.load_study(study_name=study_name(key, spec.kernel_hash),
                                  storage=self.studies)
        return study.get_trials(deepcopy=False)

    def study_attrs(self, key: TuneKey, spec) -> dict:
        study = optuna.load_study(study_name=study_name(key, spec.kernel_hash),
                                  storage=self.studies)
        return study.user_attrs

    def entry(self, key: TuneKey):
        with self.Session() as s:
            row = storage.get_result(s, key.device, key.kernel, key.dtype, key.n, key.m)
            return None if row is None else row.to_entry()

    def study_names(self) -> list[str]:
        return [s.study_name for s in optuna.get_all_study_summaries(self.studies)]

    def close(self) -> None:
        self.engine.dispose()
        self.studies.remove_session()


def assert_no_duplicate_measurements(trials: list[FrozenTrial]) -> None:
    ids = [config_id(t.params) for t in measured(trials)]
    assert len(ids) == len(set(ids)), f"a config was measured twice: {ids}"


def outcomes(trials: list[FrozenTrial]) -> list[str | None]:
    return [outcome_of(t) for t in trials]


def small_job(**overrides) -> Job:
    """Tiny shapes and few trials: fast under the interpreter."""
    fields = dict(kernels=["rmsnorm_fwd"], ns=[16, 48], dtypes=["float32", "bfloat16"],
                  m_buckets=[1, 4], trials=3, retime_rounds=2, retime_top=2)
    return Job(**{**fields, **overrides})


def tune_command(job: Job, url: str) -> list[str]:
    """`kerneltune tune` of `job` (kernels, dtypes, sizes, buckets, trials, re-timing rounds)
    against the store at `url`, without the progress bar."""
    args = [sys.executable, "-m", "kerneltune.cli", "tune", "--db", url, "--no-progress",
            "--trials", str(job.trials), "--retime-rounds", str(job.retime_rounds)]
    for flag, values in (("-k", job.kernels), ("-d", job.dtypes), ("-n", job.ns),
                         ("-m", job.m_buckets)):
        for value in values:
            args += [flag, str(value)]
    return args


def results_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(storage.Result)).scalar_one()


def started_job(job: Job, url: str, timeout_s: float = 240) -> subprocess.Popen:
    """`kerneltune tune` of `job` under the interpreter, in a process of its own (stderr piped),
    once it has stored a result; fails where it ended first."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.Popen(tune_command(job, url), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    engine = storage.make_engine(url)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(Exception):  # the tables may not exist yet
                if results_count(engine) >= 1:
                    return proc
            time.sleep(0.05)
    finally:
        engine.dispose()
    proc.kill()
    _, stderr = proc.communicate()
    pytest.fail(f"no result stored while the job ran (exit {proc.returncode}): {stderr[-2000:]!r}")


@pytest.fixture
def stored_factory():
    made: list[Stored] = []

    def make(url: str) -> Stored:
        made.append(Stored(url))
        return made[-1]

    yield make
    for s in made:
        s.close()
