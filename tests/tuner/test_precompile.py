"""The compile pool against real kernels under the Triton interpreter, and batched searches."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import optuna
import pytest

from kerneltune import storage, table
from kerneltune.kernels import REGISTRY, KernelConfig, Problem, running_hashes
from kerneltune.runtime import local
from kerneltune.tuner.cli import default_precompile
from kerneltune.tuner.job import TuneKey
from kerneltune.tuner.precompile import Precompiler
from kerneltune.tuner.protocol import problem_message
from kerneltune.tuner.runner import JobRunner, open_stores
from kerneltune.tuner.search import (
    KeySearch,
    SearchState,
    config_id,
    measured,
    neighbourhood,
    previous_winner_variants,
    study_name,
)
from kerneltune.tuner.worker import BenchmarkWorker

from .conftest import assert_no_duplicate_measurements, small_job
from .faulty_kernels import FaultyConfig

SPEC_REF = "tuner.faulty_kernels:SPEC"
PROBLEM = problem_message(Problem("faulty_double", 2, 24, "float32"))


def jsons(configs: list[KernelConfig]) -> list[dict]:
    """Typed configs as trial params and stored entries hold them."""
    return [c.to_json() for c in configs]


def test_batch_runs_every_config_and_says_which_failed():
    with Precompiler(2, interpret=True, timeout_s=120) as pool:
        out = pool.compile(SPEC_REF, PROBLEM, [FaultyConfig(MODE=m) for m in (
            "good", "bad_arange", "wrong", "good_wide")])
        assert out[0] is None and out[2] is None and out[3] is None
        assert out[1] is not None and "arange" in out[1]
        assert pool.restarts == 0


@pytest.mark.parametrize(("mode", "timeout_s", "why"), [
    ("hang_first", 20, "timeout"),  # never returns
    ("kill", 20, "timeout"),  # its process dies: the pool replaces it, the answer never comes
    ("cuda_fatal", 120, "illegal memory"),  # a dead CUDA context in a live process
])
def test_hung_dead_or_poisoned_processes_are_replaced(mode, timeout_s, why):
    with Precompiler(1, interpret=True, timeout_s=timeout_s) as pool:
        out = pool.compile(SPEC_REF, PROBLEM, [FaultyConfig(MODE=mode)])
        assert out[0] is not None and why in out[0]
        assert pool.restarts == 1
        assert pool.compile(SPEC_REF, PROBLEM, [FaultyConfig(MODE="good")]) == [None]


def test_pool_needs_a_process():
    with pytest.raises(ValueError, match="at least one process"):
        Precompiler(0)


def test_no_compile_pool_by_default_under_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter builds nothing to cache
    assert default_precompile(1) == 0


def test_batched_search_measures_each_batch_after_preparing_it(tmp_path):
    job = small_job(ns=[200], dtypes=["float32"], m_buckets=[8], trials=7, batch=3)
    key = TuneKey("cpu", "rmsnorm_fwd", "float32", 200, 8, "rmsnorm_fwd")
    assert len(list(REGISTRY["rmsnorm_fwd"].configs(key.problem()))) > 7
    spec = REGISTRY["rmsnorm_fwd"]
    batches: list[list[KernelConfig]] = []
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'studies.db'}")
    with BenchmarkWorker(interpret=True, name="batched") as worker:
        search = KeySearch(job, key, spec, storage, worker, prepare=batches.append)
        state = search.search()
    trials = measured(state.study.get_trials(deepcopy=False))
    assert state.counted == len(trials) == 7
    assert_no_duplicate_measurements(trials)
    # Batches of three (the last one short), each prepared before any of it was measured.
    assert [len(b) for b in batches] == [3, 3]  # the seventh candidate is a batch of one
    prepared = [config_id(c) for b in batches for c in b]
    assert prepared == [config_id(t.params) for t in trials][:6]
    assert all(spec.valid(key.problem(), c) for b in batches for c in b)


def test_neighbour_winners_are_tried_after_the_default(tmp_path):
    job = small_job(ns=[48], dtypes=["float32"], m_buckets=[8], trials=3)
    key = TuneKey("cpu", "rmsnorm_fwd", "float32", 48, 8, "rmsnorm_fwd")
    spec = REGISTRY["rmsnorm_fwd"]
    default = spec.default(key.problem())
    neighbour = default.replace(EVICT=not default.EVICT, num_warps=2)
    invalid = default.replace(SINGLE=False)
    assert spec.valid(key.problem(), neighbour) and not spec.valid(key.problem(), invalid)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'studies.db'}")
    with BenchmarkWorker(interpret=True, name="seeded") as worker:
        search = KeySearch(job, key, spec, storage, worker, seeds=[invalid, default, neighbour])
        state = search.search()
    trials = measured(state.study.get_trials(deepcopy=False))
    assert [t.params for t in trials[:2]] == jsons([default, neighbour])
    assert [t.user_attrs["source"] for t in trials[:2]] == ["default", "neighbour"]


def test_the_kernels_candidates_follow_the_neighbours(tmp_path):
    """A long row's first trials: the default, a neighbour's winner, then the spec's split
    candidates, before any sampling."""
    job = small_job(ns=[16384], dtypes=["float32"], m_buckets=[2], trials=4)
    key = TuneKey("cpu", "rmsnorm_fwd", "float32", 16384, 2, "rmsnorm_fwd")
    spec = REGISTRY["rmsnorm_fwd"]
    problem = key.problem()
    default, candidates = spec.default(problem), spec.candidates(problem)
    neighbour = default.replace(num_warps=16)
    assert len(candidates) >= 2 and neighbour not in candidates and spec.valid(problem, neighbour)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'studies.db'}")
    with BenchmarkWorker(interpret=True, name="candidates") as worker:
        state = KeySearch(job, key, spec, storage, worker, seeds=[neighbour]).search()
    trials = measured(state.study.get_trials(deepcopy=False))
    assert [t.params for t in trials] == jsons([default, neighbour, *candidates[:2]])
    assert [t.user_attrs["source"] for t in trials] == ["default", "neighbour", "candidate",
                                                        "candidate"]


def test_candidates_outside_the_space_are_not_tried(tmp_path):
    """One row: the candidates with two rows a block are not in its space, and not tried."""
    key = TuneKey("cpu", "rmsnorm_fwd", "float32", 16384, 1, "rmsnorm_fwd")
    spec = REGISTRY["rmsnorm_fwd"]
    problem = key.problem()
    inside = [c for c in spec.candidates(problem) if spec.rejects(problem, c) is None]
    assert inside and len(inside) < len(spec.candidates(problem))
    # Room for the default and every candidate inside.
    job = small_job(ns=[16384], dtypes=["float32"], m_buckets=[1], trials=1 + len(inside))
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'studies.db'}")
    with BenchmarkWorker(interpret=True, name="outside") as worker:
        state = KeySearch(job, key, spec, storage, worker).search()
    trials = measured(state.study.get_trials(deepcopy=False))
    assert [t.params for t in trials if t.user_attrs["source"] == "candidate"] == jsons(inside)
    assert all(spec.rejects(problem, spec.config_type.from_json(t.params)) is None
               for t in trials)


def test_job_with_a_compile_pool_seeds_each_bucket_with_the_one_below(tmp_path,
                                                                      stored_factory):
    url = f"sqlite:///{tmp_path / 'kerneltune.db'}"
    job = small_job(ns=[48], dtypes=["float32"], m_buckets=[1, 2], trials=4, precompile=2,
                    batch=2)
    runner = JobRunner(job, url, workers=1)
    report = runner.run()
    assert report.status == "done"
    stored = stored_factory(url)
    low, high = (r.key for r in report.keys)
    assert jsons(runner.neighbour_configs(high)) == [stored.entry(low).config]
    assert jsons(runner.neighbour_configs(low)) == [stored.entry(high).config]
    for key in (low, high):
        assert_no_duplicate_measurements(stored.trials(key, REGISTRY["rmsnorm_fwd"]))


def test_a_key_is_seeded_with_the_winners_of_the_nearest_tuned_buckets(tmp_path,
                                                                      stored_factory):
    """Buckets 1, 4 and 16 tuned: 4 takes the winners of 1 and 16, 16 that of 4 alone (the
    nearest below; nothing above), and an untuned 64 that of 16."""
    url = f"sqlite:///{tmp_path / 'kerneltune.db'}"
    job = small_job(ns=[48], dtypes=["float32"], m_buckets=[1, 4, 16], trials=2)
    runner = JobRunner(job, url, workers=1)
    report = runner.run()
    assert report.status == "done"
    stored = stored_factory(url)
    one, four, sixteen = sorted((r.key for r in report.keys), key=lambda k: k.m)
    assert jsons(runner.neighbour_configs(four)) == [stored.entry(one).config,
                                                     stored.entry(sixteen).config]
    assert jsons(runner.neighbour_configs(sixteen)) == [stored.entry(four).config]
    untuned = TuneKey(one.device, one.kernel, one.dtype, one.n, 64, one.spec_ref)
    assert jsons(runner.neighbour_configs(untuned)) == [stored.entry(sixteen).config]


def test_a_16_bit_key_is_seeded_with_the_other_16_bit_dtypes_winner(tmp_path, stored_factory):
    url = f"sqlite:///{tmp_path / 'kerneltune.db'}"
    runner = JobRunner(small_job(ns=[48], dtypes=["bfloat16"], m_buckets=[4], trials=2), url,
                       workers=1)
    report = runner.run()
    assert report.status == "done"
    (bf16,) = (r.key for r in report.keys)
    fp16 = TuneKey(bf16.device, bf16.kernel, "float16", bf16.n, bf16.m, bf16.spec_ref)
    fp32 = TuneKey(bf16.device, bf16.kernel, "float32", bf16.n, bf16.m, bf16.spec_ref)
    assert jsons(runner.neighbour_configs(fp16)) == [stored_factory(url).entry(bf16).config]
    assert runner.neighbour_configs(fp32) == []  # another width: other bytes, other winners


def test_a_key_is_seeded_first_with_its_winner_on_the_previous_kernel_code(tmp_path,
                                                                           stored_factory):
    url = f"sqlite:///{tmp_path / 'kerneltune.db'}"
    runner = JobRunner(small_job(ns=[48], dtypes=["float32"], m_buckets=[4, 8], trials=2), url,
                       workers=1)
    report = runner.run()
    assert report.status == "done"
    low, high = (r.key for r in report.keys)
    stored = stored_factory(url)
    spec = REGISTRY["rmsnorm_fwd"]
    wide = spec.default(high.problem()).replace(num_warps=4, ROWS=2, EVICT=False)
    assert wide.to_json() != stored.entry(high).config
    # As if `high` had been tuned on code without COOP: the seed ran without it.
    previous = {k: v for k, v in wide.to_json().items() if k != "COOP"}
    with stored.Session.begin() as s:
        storage.upsert_result(s, high.device, replace(
            stored.entry(high), config=previous, kernel_hash="0" * 16))
    assert jsons(runner.neighbour_configs(high)) == [wide.to_json(), stored.entry(low).config]
    # What the new code does not know is no seed.
    with stored.Session.begin() as s:
        storage.upsert_result(s, high.device, replace(
            stored.entry(high), config={**previous, "GONE": 1}, kernel_hash="1" * 16))
    assert jsons(runner.neighbour_configs(high)) == [stored.entry(low).config]


@dataclasses.dataclass(frozen=True, repr=False, kw_only=True)
class ABC(KernelConfig):
    A: int
    B: bool
    C: str


def test_neighbourhood_changes_one_parameter_nearest_choices_first():
    space = {"A": [1, 2, 4, 8], "B": [True, False], "C": ["x", "y", "z"]}
    ring = jsons(list(neighbourhood(ABC(A=2, B=True, C="x"), space)))
    assert ring == [
        {"A": 1, "B": True, "C": "x"}, {"A": 4, "B": True, "C": "x"},  # one step
        {"A": 2, "B": False, "C": "x"}, {"A": 2, "B": True, "C": "y"},
        {"A": 8, "B": True, "C": "x"}, {"A": 2, "B": True, "C": "z"},  # two steps
    ]


def test_a_previous_winner_is_tried_with_each_value_of_a_parameter_added_since():
    spec = REGISTRY["rmsnorm_quant_fwd"]
    problem = spec.problem(4096, 7168, "bfloat16")
    whole = spec.default(problem)
    assert whole.SINGLE and not whole.X_LAYOUT
    before = {k: v for k, v in whole.to_json().items() if k != "X_LAYOUT"}
    assert previous_winner_variants(spec, problem, before) == [whole,
                                                               whole.replace(X_LAYOUT=True)]
    # Nothing added: the winner alone. Added but invalid with it (the split keeps q's own
    # layout): the winner alone.
    assert previous_winner_variants(spec, problem, whole.to_json()) == [whole]
    long_rows = spec.problem(4096, 65536)
    split = next(c for c in spec.candidates(long_rows) if c.COOP)
    stored = {k: v for k, v in split.to_json().items() if k != "X_LAYOUT"}
    assert previous_winner_variants(spec, long_rows, stored) == [split]
    with pytest.raises(ValueError, match="GONE"):
        previous_winner_variants(spec, problem, {**before, "GONE": 1})


def test_search_tries_the_defaults_neighbourhood_before_sampling(tmp_path):
    """The default, the kernel's candidates, then the default's neighbourhood, each once."""
    job = small_job(ns=[200], dtypes=["float32"], m_buckets=[8], trials=9)
    key = TuneKey("cpu", "rmsnorm_fwd", "float32", 200, 8, "rmsnorm_fwd")
    spec = REGISTRY["rmsnorm_fwd"]
    problem, default = key.problem(), spec.default(key.problem())
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'studies.db'}")
    with BenchmarkWorker(interpret=True, name="local") as worker:
        state = KeySearch(job, key, spec, storage, worker).search()
    trials = measured(state.study.get_trials(deepcopy=False))
    first = {config_id(default): (default, "default")}
    for config in spec.candidates(problem):
        first.setdefault(config_id(config), (config, "candidate"))
    candidates = len(first) - 1
    assert 0 < candidates < 9 - 2
    for config in neighbourhood(default, spec.space(problem)):
        if spec.valid(problem, config):
            first.setdefault(config_id(config), (config, "local"))
    expected = list(first.values())[:9]
    assert [t.params for t in trials] == jsons([c for c, _ in expected])
    assert [t.user_attrs["source"] for t in trials] == [s for _, s in expected]
    assert [s for _, s in expected].count("local") >= 2


def test_a_resumed_search_runs_again_a_config_that_ran_out_of_memory(tmp_path):
    """A study holding the default as run out of memory in its check, and the first candidate
    as failed otherwise: a resumed search measures the default again and not the candidate."""
    key = TuneKey("cpu", "rmsnorm_fwd", "float32", 200, 8, "rmsnorm_fwd")
    spec = REGISTRY["rmsnorm_fwd"]
    problem = key.problem()
    default = spec.default(problem)
    candidate = next(c for c in spec.candidates(problem) if config_id(c) != config_id(default))
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'studies.db'}")
    stored = optuna.create_study(study_name=study_name(key, spec.kernel_hash), storage=storage)
    space = {k: optuna.distributions.CategoricalDistribution(v)
             for k, v in spec.space(problem).items()}
    for config, reason in [(default, "check: OutOfMemoryError: CUDA out of memory. Tried to "
                                     "allocate 32.00 GiB"),
                           (candidate, "check: RuntimeError: an error of the config's own")]:
        stored.add_trial(optuna.trial.create_trial(
            params=config.to_json(), distributions=space, state=optuna.trial.TrialState.PRUNED,
            user_attrs={"outcome": "error", "reason": reason}))
    job = small_job(ns=[200], dtypes=["float32"], m_buckets=[8], trials=4)
    with BenchmarkWorker(interpret=True, name="local") as worker:
        state = KeySearch(job, key, spec, storage, worker).search()
    added = measured(state.study.get_trials(deepcopy=False))[2:]
    assert len(added) == 2
    assert added[0].params == default.to_json() and added[0].user_attrs["outcome"] == "ok"
    assert all(t.params != candidate.to_json() for t in added)


def test_a_resumed_search_polishes_its_incumbent_first(tmp_path):
    """More trials for a searched key, once its default and candidates are measured, go to the
    one-parameter neighbourhood of what the key has: the fastest trial while no search
    finished, then the pick its last search made (re-timed side by side, so trusted over a
    faster search time)."""
    key = TuneKey("cpu", "rmsnorm_fwd", "float32", 200, 8, "rmsnorm_fwd")
    spec = REGISTRY["rmsnorm_fwd"]
    problem = key.problem()
    first = 1 + len({config_id(c) for c in spec.candidates(problem)} - {
        config_id(spec.default(problem))}) + 1  # the default, the candidates, one more
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'studies.db'}")

    def search(trials: int) -> KeySearch:
        job = small_job(ns=[200], dtypes=["float32"], m_buckets=[8], trials=trials)
        return KeySearch(job, key, spec, storage, worker)

    def new_trials(state: SearchState, before: int) -> list:
        return measured(state.study.get_trials(deepcopy=False))[before:]

    def ring(params: dict, known: list, count: int) -> list[dict]:
        """The first `count` valid configs around a trial's `params` that `known` lacks."""
        seen = {config_id(t.params) for t in known}
        out = []
        for c in neighbourhood(spec.config_type.from_json(params), spec.space(problem)):
            if spec.valid(problem, c) and config_id(c) not in seen:
                seen.add(config_id(c))
                out.append(c.to_json())
        return out[:count]

    with BenchmarkWorker(interpret=True, name="local") as worker:
        state = search(first).search()
        done = measured(state.study.get_trials(deepcopy=False))
        fastest = min((t for t in done if t.value is not None), key=lambda t: t.value)
        state = search(first + 3).search()
        added = new_trials(state, first)
        assert [t.user_attrs["source"] for t in added] == ["polish"] * 3
        assert [t.params for t in added] == ring(fastest.params, done, 3)

        # A finished search's pick is polished, even where a trial's search time was faster.
        done = measured(state.study.get_trials(deepcopy=False))
        slowest = max((t for t in done if t.value is not None), key=lambda t: t.value)
        assert slowest.params != fastest.params
        stored = optuna.load_study(study_name=state.study.study_name, storage=storage)
        stored.set_user_attr("done", {"finalists": [{"config": slowest.params,
                                                     "rounds_us": [1.0]}]})
        state = search(first + 5).search()
        added = new_trials(state, first + 3)
        assert [t.user_attrs["source"] for t in added] == ["polish"] * 2
        assert [t.params for t in added] == ring(slowest.params, done, 2)


def test_finalists_are_the_runners_up_within_reach_and_the_default():
    """Re-timing is for configs that could still win: runners-up more than `retime_within`
    behind the best search time are left out; the default is always re-timed."""
    key = TuneKey("cpu", "rmsnorm_fwd", "float32", 200, 8, "rmsnorm_fwd")
    spec = REGISTRY["rmsnorm_fwd"]
    default = spec.default(key.problem())
    a, b, c = [cfg for cfg in spec.configs(key.problem()) if cfg != default][:3]
    space = spec.space(key.problem())
    distributions = {k: optuna.distributions.CategoricalDistribution(v) for k, v in space.items()}
    study = optuna.create_study()
    for config, us in ((a, 10.0), (b, 10.4), (c, 10.6), (default, 20.0)):
        study.add_trial(optuna.trial.create_trial(params=config.to_json(),
                                                  distributions=distributions, value=us))

    def finalists(within: float) -> list[str]:
        job = small_job(ns=[200], dtypes=["float32"], m_buckets=[8], retime_top=3,
                        retime_within=within)
        search = KeySearch(job, key, spec, optuna.storages.InMemoryStorage(), worker=None)
        return sorted(config_id(f) for f in search.finalists(study))

    assert finalists(0.05) == sorted(map(config_id, (a, b, default)))
    assert finalists(0.10) == sorted(map(config_id, (a, b, c, default)))
    assert finalists(0.0) == sorted(map(config_id, (a, default)))


def test_finalists_include_the_config_the_key_picked_last_time():
    """A key tuned again re-times its previous winner whatever its search time says: that time
    may come from older code or timing (graphs captured after the check ran 5-16% slow at
    multi-GB problems), so a new trial that looks faster must beat it side by side."""
    key = TuneKey("cpu", "rmsnorm_fwd", "float32", 200, 8, "rmsnorm_fwd")
    spec = REGISTRY["rmsnorm_fwd"]
    default = spec.default(key.problem())
    a, b, before, other = [cfg for cfg in spec.configs(key.problem()) if cfg != default][:4]
    space = spec.space(key.problem())
    distributions = {k: optuna.distributions.CategoricalDistribution(v) for k, v in space.items()}
    study = optuna.create_study()
    for config, us in ((a, 10.0), (b, 10.4), (before, 13.0), (other, 12.0), (default, 20.0)):
        study.add_trial(optuna.trial.create_trial(params=config.to_json(),
                                                  distributions=distributions, value=us))
    job = small_job(ns=[200], dtypes=["float32"], m_buckets=[8], retime_top=3,
                    retime_within=0.05)
    search = KeySearch(job, key, spec, optuna.storages.InMemoryStorage(), worker=None)
    assert search.previous_winner(study) is None
    assert sorted(map(config_id, search.finalists(study))) == sorted(
        map(config_id, (a, b, default)))

    study.set_user_attr("done", {"finalists": [
        {"config": other.to_json(), "rounds_us": [12.5, 12.6]},
        {"config": before.to_json(), "rounds_us": [11.0, 11.1]},
        {"config": default.to_json(), "rounds_us": [19.0]}]})
    assert search.previous_winner(study) == before
    assert sorted(map(config_id, search.finalists(study))) == sorted(
        map(config_id, (a, b, before, default)))
    # A winner the space no longer holds is not re-timed.
    study.set_user_attr("done", {"finalists": [{"config": {**before.to_json(), "GONE": 1},
                                                "rounds_us": [11.0]}]})
    assert sorted(map(config_id, search.finalists(study))) == sorted(
        map(config_id, (a, b, default)))


def test_a_resumed_search_re_times_the_winner_its_stored_study_recorded():
    """The search runs on an in-memory copy of the stored study, and picks from that copy: the
    copy must carry the last search's finalists, or their winner is never re-timed."""
    key = TuneKey("cpu", "rmsnorm_fwd", "float32", 200, 8, "rmsnorm_fwd")
    spec = REGISTRY["rmsnorm_fwd"]
    default = spec.default(key.problem())
    new, before = [cfg for cfg in spec.configs(key.problem()) if cfg != default][:2]
    job = small_job(ns=[200], dtypes=["float32"], m_buckets=[8], trials=2, retime_top=1)
    search = KeySearch(job, key, spec, optuna.storages.InMemoryStorage(), worker=None)
    stored = search.open_study()
    distributions = {k: optuna.distributions.CategoricalDistribution(v)
                     for k, v in search.space.items()}
    for config, us in ((new, 10.0), (before, 13.0), (default, 20.0)):
        stored.add_trial(optuna.trial.create_trial(params=config.to_json(),
                                                   distributions=distributions, value=us))
    stored.set_user_attr("done", {"finalists": [{"config": before.to_json(),
                                                 "rounds_us": [12.0, 12.1]}]})
    copy = search.working_copy(stored)
    assert search.previous_winner(copy) == before
    assert sorted(map(config_id, search.finalists(copy))) == sorted(
        map(config_id, (new, before, default)))


def test_a_seed_tables_config_is_tried_right_after_the_default(tmp_path, stored_factory):
    """Another GPU's winner for the key is measured second, as this code reads it; one this
    code cannot read, or not valid here, is no seed."""
    spec = REGISTRY["rmsnorm_fwd"]
    problem = Problem("rmsnorm_fwd", 4, 48, "float32")
    default = spec.default(problem)
    other = next(c for c in spec.configs(problem) if c != default and not c.COOP)
    assert not default.COOP
    # As code without COOP wrote it:
    elsewhere = {k: v for k, v in other.to_json().items() if k != "COOP"}
    entry = table.Entry("rmsnorm_fwd", "float32", 48, 4, elsewhere, 1.0, 1.0, 1.0, 8, "0" * 16)
    unknown = replace(entry, config={**elsewhere, "GONE": 1})
    seeds = [table.save(table.Table(f"GPU {i}", entries=[e]), tmp_path / f"{i}.json")
             for i, e in enumerate((unknown, entry))]
    url = f"sqlite:///{tmp_path / 'kerneltune.db'}"
    job = small_job(ns=[48], dtypes=["float32"], m_buckets=[4], trials=2,
                    seed_tables=[str(p) for p in seeds])
    runner = JobRunner(job, url, workers=1)
    report = runner.run()
    assert report.status == "done"
    (tuned,) = (r.key for r in report.keys)
    assert runner.neighbour_configs(tuned) == [other]
    trials = measured(stored_factory(url).trials(tuned, spec))
    assert [(t.params, t.user_attrs["source"]) for t in trials] == [
        (default.to_json(), "default"), (other.to_json(), "neighbour")]


def test_a_seed_table_that_cannot_be_read_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    for path in (bad, tmp_path / "missing.json"):
        with pytest.raises((table.TableError, OSError)):
            JobRunner(small_job(seed_tables=[str(path)]), f"sqlite:///{tmp_path / 'k.db'}")


def test_a_keys_batches_are_compiled_for_every_problem_its_entry_serves(tmp_path):
    """Quant's candidates run as int8 and as fp8 (distinct kernels to Triton): the compile pool
    gets each batch for both, so neither mode compiles while it is timed."""
    job = small_job(kernels=["rmsnorm_quant_fwd"], ns=[256], dtypes=["bfloat16"],
                    m_buckets=[4], trials=2)
    url = f"sqlite:///{tmp_path / 'kerneltune.db'}"
    runner = JobRunner(job, url, workers=1)
    runner.engine, runner.study_store = open_stores(url)  # what a run opens first
    (key,) = job.keys(table.INTERPRETER_DEVICE)
    compiled: list[tuple[str, dict, list]] = []

    class Recorder:
        def compile(self, spec_ref, problem, configs):
            compiled.append((spec_ref, problem, configs))

    search = runner._search(key, None, Recorder())
    batch = [search.default]
    assert search.prepare is not None
    search.prepare(batch)
    assert [(ref, dict(p["options"]), c) for ref, p, c in compiled] == [
        (key.spec_ref or key.kernel, {"quant": "int8"}, batch),
        (key.spec_ref or key.kernel, {"quant": "fp8"}, batch)]
    runner.engine.dispose()


def test_another_gpus_entry_this_gpu_would_borrow_seeds_the_search(tmp_path, stored_factory,
                                                                   monkeypatch):
    """A job on a GPU with no table of its own measures, right after the default, the config
    a runtime there would borrow (another GPU's local table); KERNELTUNE_TRANSFER=0 drops it."""
    spec = REGISTRY["rmsnorm_fwd"]
    problem = Problem("rmsnorm_fwd", 4, 48, "float32")
    default = spec.default(problem)
    other = next(c for c in spec.configs(problem) if c != default)
    entry = table.Entry("rmsnorm_fwd", "float32", 48, 4, other.to_json(), 1.0, 1.0, 1.0, 8,
                        spec.kernel_hash)
    local.refresh_table(table.Table("NVIDIA Elsewhere", entries=[entry]), running_hashes())
    for transfer in ("1", "0"):
        monkeypatch.setenv("KERNELTUNE_TRANSFER", transfer)
        url = f"sqlite:///{tmp_path / f'kerneltune-{transfer}.db'}"
        job = small_job(ns=[48], dtypes=["float32"], m_buckets=[4], trials=2,
                        device="NVIDIA Tuned Here")
        runner = JobRunner(job, url, workers=1)
        report = runner.run()
        assert report.status == "done"
        (tuned,) = (r.key for r in report.keys)
        trials = measured(stored_factory(url).trials(tuned, spec))
        sources = [(t.params, t.user_attrs["source"]) for t in trials]
        if transfer == "1":
            assert runner.neighbour_configs(tuned) == [other]
            assert sources[:2] == [(default.to_json(), "default"), (other.to_json(), "neighbour")]
        else:
            assert runner.neighbour_configs(tuned) == []
            assert "neighbour" not in [source for _, source in sources]
