"""What a key's searches on earlier kernel code found fast seeds its search on this code: the
fastest distinct configs they measured that this code can still run, read from a real Optuna
store, after the previous winner and before the adjacent keys' winners."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import CategoricalDistribution

from kerneltune.kernels import REGISTRY
from kerneltune.tuner.job import TuneKey
from kerneltune.tuner.runner import EARLIER_CODE_SEEDS, JobRunner
from kerneltune.tuner.search import fastest_measured, study_name

from .conftest import small_job

SPEC = REGISTRY["rmsnorm_fwd"]
KEY = TuneKey("NVIDIA Test GPU", "rmsnorm_fwd", "float32", 48, 64, "rmsnorm_fwd")
PROBLEM = KEY.problem()
BASE = SPEC.default(PROBLEM)  # a whole row of 48 in a block of 64
SPACE = SPEC.space(PROBLEM)


def add_study(storage, key: TuneKey, kernel_hash: str,
              trials: list[tuple[dict, float | None, str]]) -> None:
    """The key's study on code `kernel_hash`, with finished trials of (config changes from
    BASE, value, outcome)."""
    study = optuna.create_study(study_name=study_name(key, kernel_hash), storage=storage)
    for changes, value, outcome in trials:
        params = {**BASE.to_json(), **changes}
        study.add_trial(optuna.trial.create_trial(
            params=params, value=value, user_attrs={"outcome": outcome},
            state=(optuna.trial.TrialState.COMPLETE if value is not None
                   else optuna.trial.TrialState.PRUNED),
            distributions={k: CategoricalDistribution(SPACE.get(k, [v]))
                           for k, v in params.items()}))


@pytest.fixture
def store(tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'store.db'}")
    add_study(storage, KEY, "old", [
        ({"num_warps": 2}, 5.0, "ok"),
        ({"num_warps": 1}, 3.0, "ok"),
        ({"num_warps": 2}, 4.0, "ok"),  # measured again, faster: its best counts
        ({"BLOCK_N": 16}, 1.0, "ok"),  # a block shorter than the row: not valid
        ({"ROWS": 8}, 2.0, "ok"),  # 512 elements give 4 warps fewer than 8 a thread: not valid
        ({"num_warps": 16}, None, "timeout"),  # no time
    ])
    add_study(storage, KEY, "new", [
        ({"EVICT": False}, 3.5, "ok"),
        ({"GONE": 1}, 0.5, "ok"),  # a parameter today's code does not have
        ({"num_warps": 1}, 3.2, "ok"),  # slower than the old code's reading of it
        ({"GRID_MULT": 2}, 0.8, "ok"),
    ])
    other = TuneKey(KEY.device, KEY.kernel, KEY.dtype, 64, KEY.m, KEY.spec_ref)
    add_study(storage, other, "new", [({"GRID_MULT": 3}, 0.1, "ok")])  # another key
    yield storage
    storage.engine.dispose()


def test_the_fastest_valid_configs_of_the_keys_searches(store):
    everything = [(BASE.replace(GRID_MULT=2), 0.8), (BASE.replace(num_warps=1), 3.0),
                  (BASE.replace(EVICT=False), 3.5), (BASE.replace(num_warps=2), 4.0)]
    assert fastest_measured(store, KEY, SPEC, 10) == everything
    assert fastest_measured(store, KEY, SPEC, 2) == everything[:2]
    assert fastest_measured(store, KEY, SPEC, 10, except_code="new") == [
        (BASE.replace(num_warps=1), 3.0), (BASE.replace(num_warps=2), 4.0)]
    elsewhere = TuneKey("NVIDIA Other GPU", *[getattr(KEY, f) for f in ("kernel", "dtype", "n",
                                                                        "m", "spec_ref")])
    assert fastest_measured(store, elsewhere, SPEC, 10) == []


def test_a_search_on_new_code_is_seeded_with_what_the_earlier_code_found_fast(tmp_path):
    url = f"sqlite:///{tmp_path / 'kerneltune.db'}"
    runner = JobRunner(small_job(ns=[48], dtypes=["float32"], m_buckets=[4], trials=3), url,
                       workers=1)
    report = runner.run()
    assert report.status == "done"
    (key,) = (r.key for r in report.keys)
    assert runner.neighbour_configs(key) == []  # its own study is no earlier code
    # Two searches of the key on earlier code, beside the one on this code.
    base = SPEC.default(key.problem())
    fast = [base.replace(**c) for c in ({"LATE_RELEASE": True}, {"GRID_MULT": 2},
                                        {"EVICT": False}, {"GRID_MULT": 3})]
    too_wide = base.replace(num_warps=2)  # four rows of 48 give two warps too few elements
    assert not SPEC.valid(key.problem(), too_wide)
    for kernel_hash, timed in (("0" * 16, [(too_wide, 5.0), (fast[0], 10.0), (fast[2], 12.0)]),
                               ("1" * 16, [(fast[1], 11.0), (fast[3], 13.0)])):
        study = optuna.create_study(study_name=study_name(key, kernel_hash),
                                    storage=runner.study_store)
        for config, us in timed:
            study.add_trial(optuna.trial.create_trial(
                params=config.to_json(), value=us, user_attrs={"outcome": "ok"},
                distributions={k: CategoricalDistribution(SPEC.space(key.problem())[k])
                               for k in config}))
    assert runner.neighbour_configs(key) == fast[:EARLIER_CODE_SEEDS]
