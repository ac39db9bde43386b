"""Merging stores tuned apart, real SQLite files (and a real PostgreSQL target), searches run
under the Triton interpreter."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kerneltune.cli import app
from kerneltune.table import INTERPRETER_DEVICE
from kerneltune.tuner.merge import merge_stores
from kerneltune.tuner.runner import JobRunner
from kerneltune.tuner.search import config_id, measured

from .conftest import assert_no_duplicate_measurements, small_job

runner = CliRunner()


def tune(url: str, **job):
    report = JobRunner(small_job(dtypes=["float32"], m_buckets=[1], **job), url, workers=1).run()
    assert report.status == "done"
    return report


@pytest.fixture(scope="module")
def apart(tmp_path_factory):
    """Two stores, each searched on its own: (a_url, a_report, b_url, b_report). They share the
    key N = 16 (searched further in b) and each has one of its own (N = 32, N = 48)."""
    folder = tmp_path_factory.mktemp("apart")
    a, b = f"sqlite:///{folder / 'a.db'}", f"sqlite:///{folder / 'b.db'}"
    return a, tune(a, ns=[16, 32], trials=3), b, tune(b, ns=[16, 48], trials=6, seed=2)


def copy_of(url: str, tmp_path, name: str) -> str:
    from .test_runner import copy_store

    return f"sqlite:///{copy_store(url, tmp_path / name)}"


def test_a_merge_gives_the_target_every_search_and_the_faster_result(apart, tmp_path,
                                                                    stored_factory):
    a_url, a_report, b_url, b_report = apart
    target = copy_of(a_url, tmp_path, "target.db")
    report = merge_stores(b_url, target)
    assert (report.studies_copied, report.studies_extended) == (1, 1)  # N = 48; N = 16
    assert report.results_read == 2 and not report.studies_skipped

    merged, a, b = (stored_factory(u) for u in (target, a_url, b_url))
    spec = small_job().specs()[a_report.keys[0].key.spec_ref]
    by_n = {r.key.n: r for r in [*a_report.keys, *b_report.keys]}
    assert set(by_n) == {16, 32, 48}
    for n, result in by_n.items():
        key = result.key
        trials = merged.trials(key, spec)
        assert_no_duplicate_measurements(trials)
        ran = {config_id(t.params) for t in measured(trials)}
        own = [s.trials(key, spec) for s, keys in ((a, a_report), (b, b_report))
               if key in {r.key for r in keys.keys}]
        assert ran == set().union(*({config_id(t.params) for t in measured(t)} for t in own))
        entry = merged.entry(key)
        assert entry is not None
        if n == 16:  # both searched it: the faster of their results
            assert entry.us == min(a.entry(key).us, b.entry(key).us)
            assert report.trials_added == len(ran) - len(measured(a.trials(key, spec)))
        else:
            assert entry == result.entry
    # A job over all three keys finds them done: nothing is searched again.
    again = JobRunner(small_job(dtypes=["float32"], m_buckets=[1], ns=[16, 32, 48]), target,
                      workers=1).run()
    assert {r.status for r in again.keys} == {"done"}


def test_merging_again_adds_nothing(apart, tmp_path):
    a_url, _, b_url, _ = apart
    target = copy_of(a_url, tmp_path, "target.db")
    merge_stores(b_url, target)
    report = merge_stores(b_url, target)
    assert (report.studies_copied, report.studies_extended, report.trials_added) == (0, 0, 0)
    assert report.results_stored == 0


@pytest.mark.postgres
def test_a_lone_worker_s_sqlite_store_merges_into_the_shared_postgresql(apart, pg_url,
                                                                         stored_factory):
    a_url, a_report, _, _ = apart
    report = merge_stores(a_url, pg_url)
    assert (report.studies_copied, report.results_stored) == (2, 2)
    shared = stored_factory(pg_url)
    for r in a_report.keys:
        assert shared.entry(r.key) == r.entry


def test_the_merge_command(apart, tmp_path):
    a_url, _, b_url, _ = apart
    target = copy_of(a_url, tmp_path, "target.db")
    source = b_url.removeprefix("sqlite:///")
    result = runner.invoke(app, ["merge", source, "--db", target])
    assert result.exit_code == 0, result.output
    assert "studies: 1 copied, 1 extended by" in result.output
    assert "results:" in result.output and "of 2 stored" in result.output
    args = ["export", "--device", INTERPRETER_DEVICE, "--db", target]
    assert {e.n for e in _entries(runner.invoke(app, args).stdout)} == {16, 32, 48}

    missing = runner.invoke(app, ["merge", str(tmp_path / "nowhere.db"), "--db", target])
    assert missing.exit_code == 1 and "no store at" in missing.output
    itself = runner.invoke(app, ["merge", target, "--db", target])
    assert itself.exit_code == 1 and "is the store to merge into" in itself.output


def test_merging_a_store_into_itself_is_refused_however_its_path_is_written(
        apart, tmp_path, monkeypatch):
    a_url, _, _, _ = apart
    target = copy_of(a_url, tmp_path, "target.db")
    (tmp_path / "link.db").symlink_to(tmp_path / "target.db")
    monkeypatch.chdir(tmp_path)
    for source, db in [("target.db", target), ("link.db", target),
                       (str(tmp_path / "target.db"), "sqlite:///target.db")]:
        result = runner.invoke(app, ["merge", source, "--db", db])
        assert result.exit_code == 1, (source, db, result.output)
        assert "is the store to merge into" in result.output


def _entries(text: str):
    from kerneltune import table

    return table.loads(text).entries


def test_a_study_whose_trials_cannot_join_is_reported_and_left_as_it_was(apart, tmp_path,
                                                                         stored_factory):
    import optuna

    a_url, a_report, b_url, _ = apart
    target = copy_of(a_url, tmp_path, "target.db")
    source = copy_of(b_url, tmp_path, "source.db")
    # The source's study of N = 16 saw a parameter with other choices (another space).
    key = next(r.key for r in a_report.keys if r.key.n == 16)
    spec = small_job().specs()[key.spec_ref]
    src = stored_factory(source)
    name = next(n for n in src.study_names() if ":n16:" in n)
    trial = optuna.load_study(study_name=name, storage=src.studies).get_trials()[0]
    optuna.delete_study(study_name=name, storage=src.studies)
    odd = optuna.distributions.CategoricalDistribution(["a", "b"])
    optuna.create_study(study_name=name, storage=src.studies).add_trial(
        optuna.trial.create_trial(
            params={**trial.params, "num_warps": "a"},
            distributions={**trial.distributions, "num_warps": odd},
            value=1.0, user_attrs={"outcome": "ok"}))
    before = len(stored_factory(target).trials(key, spec))
    result = runner.invoke(app, ["merge", source, "--db", target])
    assert result.exit_code == 2  # merged, but not all of it
    assert f"skipped {name}: " in result.output
    assert "studies: 1 copied, 0 extended by 0 trials" in result.output
    assert len(stored_factory(target).trials(key, spec)) == before


def test_refused_results_stay_out_named_and_the_rest_is_merged(apart, tmp_path):
    """A result whose config its kernel refuses (stored before the check, or by hand) is left
    out of the target, named with why, and the merge exits 2; the source's other results go
    in."""
    from dataclasses import replace

    from kerneltune import storage

    a_url, _, b_url, _ = apart
    target = copy_of(a_url, tmp_path, "target.db")
    source = copy_of(b_url, tmp_path, "source.db")
    engine = storage.make_engine(source)
    with storage.session_factory(engine).begin() as session:
        good = storage.export_table(session, INTERPRETER_DEVICE).entries[0]
        bad = replace(good, n=64, config={**good.config, "ROWS": -1})
        storage.upsert_result(session, INTERPRETER_DEVICE, bad)
        unknown = replace(good, kernel="no_such_kernel", n=80)
        storage.upsert_result(session, INTERPRETER_DEVICE, unknown)
    engine.dispose()

    report = merge_stores(source, target)
    assert report.results_read == 4 and len(report.results_refused) == 2
    unknown_line, bad_line = report.results_refused  # in the table's order
    assert unknown_line == (f"{INTERPRETER_DEVICE}: no_such_kernel float32 n=80 m=1: "
                            "unknown kernel 'no_such_kernel'")
    assert bad_line.startswith(f"{INTERPRETER_DEVICE}: rmsnorm_fwd float32 n=64 m=1: ")
    assert "ROWS=-1" in bad_line

    again = copy_of(a_url, tmp_path, "again.db")
    result = runner.invoke(app, ["merge", source.removeprefix("sqlite:///"), "--db", again])
    assert result.exit_code == 2, result.output
    assert "refused triton-interpreter (cpu): rmsnorm_fwd float32 n=64 m=1:" in result.output
    assert "2 results refused; the others were merged" in result.output
    args = ["export", "--device", INTERPRETER_DEVICE, "--db", again]
    assert {e.n for e in _entries(runner.invoke(app, args).stdout)} == {16, 32, 48}
