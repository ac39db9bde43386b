"""`search_study.py`: `measure` times every valid config of a key (here under the interpreter),
`replay` runs the tuner's own search against those measurements, and `picks` weighs a table's
pick against the brute-force best. Given the whole space as its
budget, the search measures all of it (on made-up measurements: a failed config among them)
while wasting at most `SKIP_LIMIT` suggestions per measured config."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest

from kerneltune.kernels import KernelConfig, get_spec
from kerneltune.table import Entry, Table
from kerneltune.tuner.job import Job, TuneKey
from kerneltune.tuner.search import SKIP_LIMIT, KeySearch, config_id, measured, outcome_of
from kerneltune.tuner.select import canonical_order

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from search_study import ReplayWorker, parse_key, picks

from .script import run_script

#: A key whose space (128 valid configs) is small enough to search whole in a test.
KEY = "add_rmsnorm_fwd:200:8:bfloat16"


def script(*args: str) -> str:
    return run_script("search_study.py", *args).stdout


def made_up_brute(text: str) -> dict[str, Any]:
    """What `measure` writes for the key `text`, made up: every valid config 'measured', its
    time growing by 4% a step (in the order of each parameter's choices) away from the config
    farthest from the default; every ninth config failed its check."""
    kernel, n, m, dtype = parse_key(text)
    spec = get_spec(kernel)
    problem = spec.problem(m, n, dtype)
    space, default = spec.space(problem), spec.default(problem)
    configs = sorted(spec.configs(problem), key=canonical_order(space, default))

    def steps(a: KernelConfig, b: KernelConfig) -> int:
        return sum(abs(space[k].index(getattr(a, k)) - space[k].index(getattr(b, k)))
                   for k in space)

    best = max(configs, key=lambda c: steps(c, default))
    rows: dict[str, Any] = {}
    for i, config in enumerate(configs):
        row: dict[str, Any] = {"config": config.to_json(), "cost_s": 0.1}
        if i % 9 == 8 and config != best:
            row["error"] = "wrong output: made up"
        else:
            row["us"] = 10.0 * (1 + 0.04 * steps(config, best)) + 1e-4 * (i % 7)
        rows[config_id(config)] = row
    return {"device": "NVIDIA H200", "env": {"triton": "3.6.0"}, "precompile": 0,
            "keys": {text: {"configs": rows, "default": default.to_json(),
                            "best_us": min(r["us"] for r in rows.values() if "us" in r)}}}


def test_measure_times_every_valid_config_and_replay_draws_the_search(tmp_path):
    brute = tmp_path / "brute.json"
    script("measure", "--keys", KEY, "--out", str(brute))
    measured_ = json.loads(brute.read_text())
    assert measured_["device"] == "triton-interpreter (cpu)"
    kernel, n, m, dtype = parse_key(KEY)
    spec = get_spec(kernel)
    (data,) = measured_["keys"].values()
    valid = {config_id(c) for c in spec.configs(spec.problem(m, n, dtype))}
    assert set(data["configs"]) == valid
    times = [r["us"] for r in data["configs"].values() if "us" in r]
    assert len(times) == len(valid) and data["best_us"] == min(times)  # every config runs right
    assert all(r["cost_s"] > 0 for r in data["configs"].values())

    study_path = tmp_path / "study.json"
    script("replay", str(brute), "--seeds", "0,1", "--batch", "4", "--out", str(study_path))
    study = json.loads(study_path.read_text())
    assert study_path.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = study["keys"][KEY]
    assert [r["seed"] for r in result["runs"]] == [0, 1]
    for run in result["runs"]:
        ratios = [ratio for ratio, _ in run["curve"]]
        assert ratios == sorted(ratios, reverse=True)  # the best so far never gets worse
        hit = run["trials_to_within"]
        assert hit is not None and ratios[hit - 1] <= 1.02
        assert all(r > 1.02 for r in ratios[: hit - 1])


@pytest.mark.parametrize("batch", [1, 8])
def test_a_whole_space_budget_measures_every_valid_config(batch) -> None:
    brute = made_up_brute(KEY)
    ((text, data),) = brute["keys"].items()
    kernel, n, m, dtype = parse_key(text)
    job = Job(kernels=[kernel], ns=[n], dtypes=[dtype], m_buckets=[m], trials=10_000,
              batch=batch)
    spec = get_spec(kernel)
    worker = ReplayWorker(data["configs"], spec, spec.problem(m, n, dtype))
    search = KeySearch(job, TuneKey(brute["device"], kernel, dtype, n, m), spec,
                       optuna.storages.InMemoryStorage(), worker)
    state = search.search()
    assert state.exhausted and state.counted == len(search.valid_configs) == len(data["configs"])
    trials = state.study.get_trials(deepcopy=False)
    answered = [t for t in trials if outcome_of(t) == "ok"]
    assert len(answered) == sum("us" in row for row in data["configs"].values())
    assert min(t.value for t in answered) == data["best_us"]
    skipped = [t for t in trials if outcome_of(t) in ("invalid", "duplicate")]
    assert len(measured(trials)) == state.counted
    assert len(skipped) <= SKIP_LIMIT * (state.counted + 1)


def test_picks_weigh_a_tables_pick_against_the_brute_force_best() -> None:
    brute = made_up_brute(KEY)
    ((text, data),) = brute["keys"].items()
    kernel, n, m, dtype = parse_key(text)
    timed = sorted((r for r in data["configs"].values() if "us" in r), key=lambda r: r["us"])
    runner_up = timed[1]
    table = Table("NVIDIA H200", entries=[
        Entry(kernel, dtype, n=n, m=m, config=runner_up["config"], us=1.0, gbps=1.0,
              default_us=1.0, trials=12, kernel_hash="hash")])
    (result,) = picks(brute, table).values()
    assert result["best"] == timed[0]["config"] and result["best_us"] == timed[0]["us"]
    assert result["pick_us"] == runner_up["us"] and result["pick_trials"] == 12
    assert result["pick_over_best"] == pytest.approx(runner_up["us"] / timed[0]["us"])
    assert result["valid_configs"] == len(timed)
    (missing,) = picks(brute, Table("NVIDIA H200")).values()
    assert missing["pick"] is None and missing["pick_us"] is None
