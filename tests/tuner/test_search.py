"""The search runs on an in-memory copy of the key's study: what it measured is in the store
when it stops, and a later search goes on from there."""

from __future__ import annotations

from dataclasses import replace

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState
from sqlalchemy import event

from kerneltune.table import INTERPRETER_DEVICE
from kerneltune.tuner.job import Job
from kerneltune.tuner.runner import open_stores
from kerneltune.tuner.search import KeySearch, config_id, fit_to_space, measured, outcome_of
from kerneltune.tuner.worker import BenchmarkWorker, Outcome

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
    assert after_stop[0].params == spec.default(key.problem()).to_json()  # the default first

    resumed = KeySearch(JOB, key, spec, studies, worker).search()
    assert resumed.counted == JOB.trials
    trials = stored.trials(key, spec)
    assert_no_duplicate_measurements(trials)
    assert len(measured(trials)) == JOB.trials
    assert [t.number for t in trials] == list(range(len(trials)))
    engine.dispose()
    studies.remove_session()


def grown_space(spec, drop_3: bool = False):
    """The forward's spec with one more GRID_MULT in its space, and none of 3 where `drop_3`:
    a newer spec beside studies stored under the old space (the device code, and so the study
    names, unchanged). A subclass, so that reading a config (`parse`) holds it to that space."""

    class Grown(type(spec)):
        kernel_module = spec.module

        def space(self, problem):
            space = super().space(problem)
            grid = [g for g in space["GRID_MULT"] if not (drop_3 and g == 3)]
            return {**space, "GRID_MULT": [*grid, 16]}

    return Grown()


@pytest.mark.parametrize("drop_3", [False, True])
def test_a_study_stored_under_another_space_is_fitted_to_the_new_one(
        sqlite_url, worker, stored_factory, drop_3):
    """Optuna refuses a trial whose choices differ from its study's ('dynamic value space'):
    the resumed search rebuilds the stored study in the new space, keeping each measurement it
    can still express, and writes its new trials beside them."""
    (key,) = JOB.keys(INTERPRETER_DEVICE)
    spec = JOB.specs()[key.spec_ref]
    engine, studies = open_stores(sqlite_url)
    KeySearch(JOB, key, spec, studies, worker).search()
    stored = stored_factory(sqlite_url)
    before = {config_id(t.params): t.user_attrs["median_us"] for t in measured(
        stored.trials(key, spec))}
    assert len(before) == JOB.trials

    old = replace(JOB, trials=JOB.trials + 2)
    if drop_3:  # one stored measurement at GRID_MULT = 3, which the new space drops
        third = spec.default(key.problem()).replace(GRID_MULT=3)
        if spec.valid(key.problem(), third) and config_id(third) not in before:
            KeySearch(old, key, spec, studies, worker, seeds=[third]).search()
    stored_then = {config_id(t.params): t.params["GRID_MULT"]
                   for t in measured(stored.trials(key, spec))}
    grown = grown_space(spec, drop_3)
    assert grown.kernel_hash == spec.kernel_hash
    assert 3 in stored_then.values() or not drop_3  # what the new space drops was stored
    state = KeySearch(replace(old, trials=old.trials + 2), key, grown, studies, worker).search()
    trials = stored.trials(key, spec)
    assert_no_duplicate_measurements(trials)
    after = {config_id(t.params): t.user_attrs["median_us"] for t in measured(trials)}
    kept = {c for c, g in stored_then.items() if not (drop_3 and g == 3)}
    assert {c: after[c] for c in before if c in kept} == {c: before[c] for c in before
                                                          if c in kept}
    assert set(after) >= kept and len(after) == state.counted > len(kept)
    assert all(t.distributions["GRID_MULT"].choices == tuple(grown.space(key.problem())[
        "GRID_MULT"]) for t in trials)
    assert not any(t.params["GRID_MULT"] == 3 for t in trials) or not drop_3
    engine.dispose()
    studies.remove_session()


def test_fitting_to_a_space_without_a_parameter_drops_the_trials_that_set_it(tmp_path):
    """A parameter the space lost altogether: every trial that set it, measured or queued, is
    dropped (its config is no longer one the kernel runs); the others are kept, in the new
    choices, with their values and attributes."""
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'studies.db'}")
    study = optuna.create_study(study_name="key", storage=storage, direction="minimize")
    study.set_user_attr("finalists", ["a"])
    old = {"A": CategoricalDistribution([1, 2]), "GONE": CategoricalDistribution([False, True])}
    for params, us in (({"A": 1, "GONE": True}, 3.0), ({"A": 2}, 2.0), ({"A": 1}, 1.0)):
        study.add_trial(optuna.trial.create_trial(
            params=params, distributions={k: old[k] for k in params}, value=us,
            user_attrs={"median_us": us}))
    study.enqueue_trial({"A": 2, "GONE": False})
    study.enqueue_trial({"A": 1})

    fitted = fit_to_space(storage, study, {"A": [1, 2, 4]})
    trials = fitted.get_trials(deepcopy=False)
    assert [(t.params, t.value, t.user_attrs.get("median_us")) for t in trials
            if t.state == TrialState.COMPLETE] == [({"A": 2}, 2.0, 2.0), ({"A": 1}, 1.0, 1.0)]
    assert [t.system_attrs["fixed_params"] for t in trials
            if t.state == TrialState.WAITING] == [{"A": 1}]
    assert all(t.distributions["A"].choices == (1, 2, 4) for t in trials if t.params)
    assert fitted.user_attrs == {"finalists": ["a"]}
    reloaded = optuna.load_study(study_name="key", storage=storage)
    assert len(reloaded.get_trials(deepcopy=False)) == 3


class _Recording:
    """The worker, recording the problems it evaluates and their outcomes."""

    def __init__(self, worker) -> None:
        self.worker, self.calls = worker, []

    def __getattr__(self, name):
        return getattr(self.worker, name)

    def evaluate(self, spec_ref, problem, config, **kwargs):
        outcome = self.worker.evaluate(spec_ref, problem, config, **kwargs)
        self.calls.append((dict(problem["options"]), outcome))
        return outcome


class _Served:
    """Quant's spec serving `modes` (a mode it does not have among them)."""

    def __init__(self, spec, modes) -> None:
        self._spec, self._modes = spec, modes

    def __getattr__(self, name):
        return getattr(self._spec, name)

    def served(self, problem):
        return [self._spec.problem(problem.m, problem.n, problem.dtype, quant=mode)
                for mode in self._modes]


def test_a_key_is_timed_on_every_problem_its_entry_serves(sqlite_url, worker) -> None:
    """Quant's entry has no mode: each candidate is checked and timed as int8 and as fp8, and
    its time is their mean; a mode that fails is the candidate's outcome."""
    job = Job(kernels=["rmsnorm_quant_fwd"], ns=[256], dtypes=["bfloat16"], m_buckets=[4],
              trials=1)
    (key,) = job.keys(INTERPRETER_DEVICE)
    spec = job.specs()[key.spec_ref]
    engine, studies = open_stores(sqlite_url)
    recording = _Recording(worker)
    search = KeySearch(job, key, spec, studies, recording)
    outcome = search.evaluate(search.default, seed=1)
    assert [options for options, _ in recording.calls] == [{"quant": "int8"}, {"quant": "fp8"}]
    times = [o.median_us for _, o in recording.calls]
    assert outcome.ok and outcome.median_us == pytest.approx(sum(times) / 2)

    recording.calls.clear()
    failing = KeySearch(job, key, _Served(spec, ["bogus", "int8"]), studies, recording)
    outcome = failing.evaluate(search.default, seed=1)
    assert not outcome.ok and "quant must be one of" in (outcome.reason or "")
    assert [options for options, _ in recording.calls] == [{"quant": "bogus"}]
    engine.dispose()
    studies.remove_session()


class _Counting:
    """A spec that counts the configs drawn from its `configs`."""

    def __init__(self, spec) -> None:
        self._spec, self.drawn = spec, 0

    def __getattr__(self, name):
        return getattr(self._spec, name)

    def configs(self, problem):
        for config in self._spec.configs(problem):
            self.drawn += 1
            yield config


def test_a_key_s_budget_lists_its_valid_configs_only_as_far_as_the_trials() -> None:
    # Quant's space at a long row: listing all of it took about a second, once per key a job
    # checked for being done, so a job of many done keys spent its time budget on the checks.
    job = Job(kernels=["rmsnorm_quant_fwd"], ns=[14336], dtypes=["float16"], m_buckets=[8],
              trials=2)
    (key,) = job.keys(INTERPRETER_DEVICE)
    spec = job.specs()[key.spec_ref]
    n_valid = sum(1 for _ in spec.configs(key.problem()))
    assert n_valid > 100

    counting = _Counting(spec)
    assert KeySearch(job, key, counting, None, None).budget() == 2
    assert counting.drawn == 2
    for whole in (replace(job, trials=0, sampler="brute"), replace(job, trials=n_valid + 5)):
        counting = _Counting(spec)
        assert KeySearch(whole, key, counting, None, None).budget() == n_valid
        assert counting.drawn == n_valid


def test_a_search_that_spends_its_budget_lists_no_more_of_the_space(sqlite_url, worker) -> None:
    job = Job(kernels=["rmsnorm_quant_fwd"], ns=[1024], dtypes=["bfloat16"], m_buckets=[4],
              trials=2)
    (key,) = job.keys(INTERPRETER_DEVICE)
    counting = _Counting(job.specs()[key.spec_ref])
    engine, studies = open_stores(sqlite_url)
    state = KeySearch(job, key, counting, studies, worker).search()
    assert state.counted == 2 and not state.exhausted
    # The budget's count of valid configs, then one more than it knows (not exhausted).
    assert counting.drawn == 2 * job.trials + 1
    engine.dispose()
    studies.remove_session()


class _Answering:
    """A worker that answers every candidate with the same time and keeps what it was sent."""

    def __init__(self) -> None:
        self.configs: list = []

    def evaluate(self, spec_ref, problem, config, **kwargs) -> Outcome:
        self.configs.append(config)
        return Outcome("ok", median_us=1.0, method="test")


def test_a_queued_config_the_kernel_cannot_run_is_pruned_with_why_and_the_search_goes_on():
    """A value outside the choices (Optuna refuses to suggest it) or of another type (`True`
    for 1, which Optuna hands back as it was queued): each an invalid trial with its reason;
    the worker gets typed configs of the space only."""
    job = Job(kernels=["tuner.faulty_kernels:PADDED_SPEC"], ns=[24], dtypes=["float32"],
              m_buckets=[2], trials=3)
    (key,) = job.keys(INTERPRETER_DEVICE)
    spec = job.specs()[key.spec_ref]
    worker = _Answering()
    search = KeySearch(job, key, spec, optuna.storages.InMemoryStorage(), worker)
    study = optuna.create_study()
    for params in ({"MODE": "bogus", "PAD": 0}, {"MODE": "good", "PAD": True},
                   {"MODE": "good_wide", "PAD": 1}):
        study.enqueue_trial(params)
    search._search(study)
    trials = study.get_trials(deepcopy=False)
    assert [outcome_of(t) for t in trials[:3]] == ["invalid", "invalid", "ok"]
    assert "'bogus' not in" in trials[0].user_attrs["reason"]
    assert "PAD=True is not int" in trials[1].user_attrs["reason"]
    assert len(measured(trials)) == job.trials == len(worker.configs)
    assert worker.configs[0] == spec.config_type(MODE="good_wide", PAD=1)
    assert all(type(c) is spec.config_type and spec.rejects(key.problem(), c) is None
               for c in worker.configs)
