"""A tuning job whose PostgreSQL store stops answering halfway: the job ends at once with one
line naming the store, what it stored stays, and the same command, once the store answers,
finishes the job without measuring a config twice."""

from __future__ import annotations

import os
import subprocess
import time

import psycopg
import pytest
from sqlalchemy import select

from kerneltune import storage
from kerneltune.table import INTERPRETER_DEVICE
from kerneltune.tuner.search import measured

from .conftest import (
    assert_no_duplicate_measurements,
    small_job,
    started_job,
    tune_command,
)

# Eight keys, so that the store goes away with keys left to tune.
JOB = small_job(dtypes=["float32"], m_buckets=[1, 4, 16, 64])


def stored_results(engine) -> dict[tuple[str, str, int, int], tuple[int | None, float]]:
    """(kernel, dtype, N, M bucket) -> the run that stored its row, and its time."""
    with storage.session_factory(engine)() as s:
        rows = s.scalars(select(storage.Result)).all()
    return {(r.kernel, r.dtype, r.n, r.m): (r.run_id, r.us) for r in rows}


def allow_connections(admin: str, url: str, allow: bool) -> None:
    """Let clients into the database of `url`, or shut them out, ending every session open."""
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(allow).lower()}')
        if not allow:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))


@pytest.mark.slow
@pytest.mark.postgres
def test_a_store_lost_mid_job_ends_it_in_one_line_and_the_same_command_resumes(
        pg_admin, pg_url, stored_factory):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = started_job(JOB, pg_url)
    try:
        allow_connections(pg_admin, pg_url, False)
        lost_at = time.monotonic()
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    ended_in = time.monotonic() - lost_at

    assert proc.returncode == 1, stderr[-3000:]
    assert ended_in < 60  # the candidates in flight, not a retry loop
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"store {pg_url}:"), last
    assert "accepting connections" in last or "administrator command" in last, last
    assert last.endswith("keys tuned before stay stored, and the same command resumes once "
                         "it answers"), last

    allow_connections(pg_admin, pg_url, True)
    engine = storage.make_engine(pg_url)
    keys = JOB.keys(INTERPRETER_DEVICE)
    spec = JOB.specs()["rmsnorm_fwd"]
    stored = stored_factory(pg_url)
    before = stored_results(engine)
    assert 1 <= len(before) < len(keys)
    finished = [key for key in keys if study_done(stored, key, spec)]

    done = subprocess.run(tune_command(JOB, pg_url), env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{len(finished)} already done" in done.stdout
    after = stored_results(engine)
    engine.dispose()
    assert set(after) == {(k.kernel, k.dtype, k.n, k.m) for k in keys}
    # Nothing stored before the loss is gone; a key whose search had finished keeps its row.
    assert set(before) <= set(after)
    for key in finished:
        row = (key.kernel, key.dtype, key.n, key.m)
        assert after[row] == before[row]
    for key in keys:
        trials = stored.trials(key, spec)
        assert_no_duplicate_measurements(trials)
        n_valid = sum(1 for _ in spec.configs(key.problem()))
        assert len(measured(trials)) == min(JOB.trials, n_valid)
        assert study_done(stored, key, spec)


def study_done(stored, key, spec) -> bool:
    try:
        return "done" in stored.study_attrs(key, spec)
    except KeyError:  # not begun
        return False
