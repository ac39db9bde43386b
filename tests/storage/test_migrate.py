from __future__ import annotations

import multiprocessing

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from kerneltune.storage import (
    VERSION_TABLE,
    Base,
    head_revisions,
    is_migrated,
    make_engine,
    migrate,
)

TABLES = {"devices", "tuning_runs", "results", VERSION_TABLE}


def test_migrate_from_empty_and_again(store_url):
    engine = make_engine(store_url)
    assert not is_migrated(engine)
    migrate(engine)
    assert is_migrated(engine)
    assert set(inspect(engine).get_table_names()) >= TABLES
    migrate(engine)  # idempotent
    migrate(store_url)  # by URL too
    with engine.connect() as conn:
        versions = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    assert set(versions) == set(head_revisions()) and len(versions) == 1
    engine.dispose()


def test_migrations_build_exactly_the_models(engine):
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn,
            opts={
                "compare_type": True,
                "include_name": lambda name, kind, _parent: kind != "table"
                or name != VERSION_TABLE,
            },
        )
        assert compare_metadata(context, Base.metadata) == []


def test_coexists_with_optuna_in_one_database(store_url):
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # Optuna first, with its own alembic_version table; ours must neither see nor touch it.
    storage = optuna.storages.RDBStorage(store_url)
    study = optuna.create_study(storage=storage, study_name="s")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    engine = make_engine(store_url)
    migrate(engine)
    assert is_migrated(engine)
    names = set(inspect(engine).get_table_names())
    assert {"alembic_version", "studies", "trials"} | TABLES <= names
    # Optuna still opens its storage (it checks its own schema version) and sees its trials.
    storage.remove_session()
    storage.engine.dispose()
    reopened = optuna.load_study(study_name="s", storage=optuna.storages.RDBStorage(store_url))
    assert len(reopened.trials) == 2
    engine.dispose()


def _migrate_after(barrier, url: str) -> None:
    barrier.wait()
    migrate(url)


@pytest.mark.parametrize("processes", [4])
def test_concurrent_migrate_from_many_processes(store_url, processes):
    ctx = multiprocessing.get_context("fork")  # no open connections here to share
    barrier = ctx.Barrier(processes)
    workers = [
        ctx.Process(target=_migrate_after, args=(barrier, store_url)) for _ in range(processes)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert [w.exitcode for w in workers] == [0] * processes
    engine = make_engine(store_url)
    assert is_migrated(engine)
    with engine.connect() as conn:
        assert conn.execute(text(f"SELECT count(*) FROM {VERSION_TABLE}")).scalar() == 1
    engine.dispose()


@pytest.mark.parametrize(("before", "fwd_old", "fwd_new"), [
    ("0001", "b9f3cee4a660c085", "5eaba3b3b7c1e9bb"),  # whole module -> device-code module
    ("0002", "f15b0b049ba097a0", "44ed540f5a1db013"),  # device-code module -> its Triton code
])
def test_results_and_studies_move_to_the_device_code_hashes(store_url, before, fwd_old, fwd_new):
    """A store tuned under an earlier hash rule keeps its results and studies."""
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from alembic import command

    from kerneltune.storage._migrate import alembic_config

    studies = optuna.storages.RDBStorage(store_url)
    name = f"kerneltune:GPU:rmsnorm_fwd:bfloat16:n4096:m64:{fwd_old}"
    optuna.create_study(storage=studies, study_name=name)
    optuna.create_study(storage=studies, study_name=f"not-ours:{fwd_old}")
    engine = make_engine(store_url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), before)
        conn.execute(text("INSERT INTO devices (name, first_seen, last_seen) "
                          "VALUES ('GPU', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"))
        for m, kernel_hash in ((64, fwd_old), (128, "0123456789abcdef")):
            conn.execute(text(
                "INSERT INTO results (device_id, kernel, dtype, n, m, config, us, gbps, "
                "default_us, trials, kernel_hash, fingerprint, updated_at) "
                "SELECT id, 'rmsnorm_fwd', 'bfloat16', 4096, :m, '{}', 1.0, 1.0, 1.0, 8, :h, "
                "0, CURRENT_TIMESTAMP FROM devices"),
                {"m": m, "h": kernel_hash})
    migrate(engine)
    with engine.connect() as conn:
        hashes = conn.execute(text("SELECT m, kernel_hash FROM results ORDER BY m")).all()
    assert [tuple(r) for r in hashes] == [(64, fwd_new), (128, "0123456789abcdef")]
    names = {s.study_name for s in optuna.get_all_study_summaries(studies)}
    assert names == {name.replace(fwd_old, fwd_new), f"not-ours:{fwd_old}"}
    studies.remove_session()
    studies.engine.dispose()
    engine.dispose()
