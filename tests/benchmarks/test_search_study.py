"""The tuner's search replayed against every valid config of a key timed on an H200
(`benchmarks/search_study.py`, the committed brute-force measurements): it finds the best config
early, and, given the whole space as its budget, measures all of it while wasting at most
`SKIP_LIMIT` suggestions per measured config."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import optuna

from kerneltune.kernels import get_spec
from kerneltune.tuner.job import Job, TuneKey
from kerneltune.tuner.search import SKIP_LIMIT, KeySearch, measured, outcome_of

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from search_study import ReplayWorker, parse_key, replay

BRUTE = (Path(__file__).resolve().parents[2]
         / "benchmarks/results/nvidia-h200/run4/search-study/brute-quant.json")


def test_the_search_comes_within_two_percent_of_brute_force_early() -> None:
    study = replay(json.loads(BRUTE.read_text()), seeds=[0, 1], sampler="tpe", cap=300, batch=8)
    (key,) = study["keys"].values()
    trials = [run["trials_to_within"] for run in key["runs"]]
    assert all(t is not None and t <= 0.3 * key["valid_configs"] for t in trials), trials


def test_a_whole_space_budget_measures_every_valid_config() -> None:
    brute = json.loads(BRUTE.read_text())
    ((text, data),) = brute["keys"].items()
    kernel, n, m, dtype = parse_key(text)
    job = Job(kernels=[kernel], ns=[n], dtypes=[dtype], m_buckets=[m], trials=10_000, batch=8)
    spec = get_spec(kernel)
    worker = ReplayWorker(data["configs"], spec, spec.problem(m, n, dtype))
    search = KeySearch(job, TuneKey(brute["device"], kernel, dtype, n, m), spec,
                       optuna.storages.InMemoryStorage(), worker)
    state = search.search()
    assert state.exhausted and state.counted == len(search.valid_configs)
    trials = state.study.get_trials(deepcopy=False)
    # Every recorded measurement is found (configs from before a parameter was added included).
    answered = [t for t in trials if outcome_of(t) == "ok"]
    assert len(answered) == sum("us" in row for row in data["configs"].values())
    skipped = [t for t in trials if outcome_of(t) in ("invalid", "duplicate")]
    assert len(measured(trials)) == state.counted
    assert len(skipped) <= SKIP_LIMIT * (state.counted + 1)
