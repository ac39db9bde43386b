"""`outputs_ranking.py`: the configs it times for a shape are the fastest distinct ones that
the key's searches measured, on any kernel code, that today's code can still run, read from a
real Optuna store."""

from __future__ import annotations

import sys
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from kerneltune.kernels import REGISTRY
from outputs_ranking import searched_configs

DEVICE = "NVIDIA Test GPU"
SPEC = REGISTRY["rmsnorm_fwd"]
PROBLEM = SPEC.problem(64, 48, "float32")
BASE = SPEC.default(PROBLEM)  # a whole row of 48 in a block of 64
SPACE = SPEC.space(PROBLEM)


def add_study(storage, n: int, kernel_hash: str, trials: list[tuple[dict, float | None, str]]
              ) -> None:
    """A study of the key (N = n, M bucket 64) as the tuner names it, with finished trials of
    (config changes from BASE, value, outcome)."""
    name = f"kerneltune:{DEVICE}:rmsnorm_fwd:float32:n{n}:m64:{kernel_hash}"
    study = optuna.create_study(study_name=name, storage=storage)
    for changes, value, outcome in trials:
        params = {**BASE, **changes}
        study.add_trial(optuna.trial.create_trial(
            params=params, value=value, user_attrs={"outcome": outcome},
            state=(optuna.trial.TrialState.COMPLETE if value is not None
                   else optuna.trial.TrialState.PRUNED),
            distributions={k: CategoricalDistribution(SPACE.get(k, [v]))
                           for k, v in params.items()}))


@pytest.fixture
def store(tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'store.db'}")
    add_study(storage, 48, "old", [
        ({"num_warps": 2}, 5.0, "ok"),
        ({"num_warps": 1}, 3.0, "ok"),
        ({"num_warps": 2}, 4.0, "ok"),  # measured again, faster: its best counts
        ({"BLOCK_N": 16}, 1.0, "ok"),  # a block shorter than the row: not valid today
        ({"num_warps": 16}, None, "timeout"),  # no time
        ({"ROWS": 8}, 2.0, "ok"),  # 512 elements give 4 warps fewer than 8 a thread: not valid
    ])
    add_study(storage, 48, "new", [
        ({"EVICT": False}, 3.5, "ok"),
        ({"GONE": 1}, 0.5, "ok"),  # a parameter today's code does not have
        ({"num_warps": 1}, 3.2, "ok"),  # slower than the old code's reading of it
    ])
    add_study(storage, 64, "new", [({"GRID_MULT": 2}, 0.1, "ok")])  # another key
    yield storage
    storage.engine.dispose()


def test_the_fastest_valid_configs_of_every_search_of_the_key(store):
    found = searched_configs(store, DEVICE, SPEC, PROBLEM, top=10)
    assert found == [({**BASE, "num_warps": 1}, 3.0), ({**BASE, "EVICT": False}, 3.5),
                     ({**BASE, "num_warps": 2}, 4.0)]
    assert searched_configs(store, DEVICE, SPEC, PROBLEM, top=2) == found[:2]
    assert searched_configs(store, "NVIDIA Other GPU", SPEC, PROBLEM, top=10) == []
