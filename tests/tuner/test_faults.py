"""A job over real failing candidates: each becomes a pruned trial with its reason, the job
finishes, and no wrong config is stored."""

from __future__ import annotations

import optuna
import torch

from kerneltune.table import INTERPRETER_DEVICE
from kerneltune.tuner.job import Job
from kerneltune.tuner.runner import JobRunner, open_stores
from kerneltune.tuner.search import failures, outcome_of, study_name

from .conftest import assert_no_duplicate_measurements


def test_failing_candidates_are_pruned_with_their_reasons(sqlite_url, stored_factory):
    job = Job(kernels=["tuner.faulty_kernels:JOB_SPEC"], ns=[24], dtypes=["float32"],
              m_buckets=[2], sampler="brute", trials=0, compile_timeout_s=60, run_timeout_s=4,
              retime_rounds=2)
    (key,) = job.keys(INTERPRETER_DEVICE)
    spec = job.specs()[key.spec_ref]
    # A suggestion that the constraints reject, queued before the job seeds the study.
    engine, studies = open_stores(sqlite_url)
    optuna.create_study(study_name=study_name(key, spec.kernel_hash), storage=studies
                        ).enqueue_trial({"MODE": "invalid"})
    engine.dispose()

    report = JobRunner(job, sqlite_url, workers=1).run()
    assert report.status == "done"
    (result,) = report.keys
    assert result.status == "tuned", result.reason

    trials = stored_factory(sqlite_url).trials(key, spec)
    assert_no_duplicate_measurements(trials)
    by_mode = {t.params["MODE"]: t for t in trials}
    assert set(by_mode) == set(spec.modes)
    expected = {
        "good": ("ok", None), "good_wide": ("ok", None),
        "bad_arange": ("compile_error", "power of 2"),
        "wrong": ("rejected", "wrong output"),
        "nan": ("rejected", "non-finite"),
        "hang": ("timeout", "run timed out after 4 s"),
        "kill": ("crash", "SIGKILL"),
        "invalid": ("invalid", "rejected: faulty_double: the config does not fit"),
    }
    for mode, (outcome, reason) in expected.items():
        t = by_mode[mode]
        assert outcome_of(t) == outcome, (mode, t.user_attrs)
        assert t.state.name == ("COMPLETE" if outcome == "ok" else "PRUNED")
        if reason:
            assert reason in t.user_attrs["reason"], (mode, t.user_attrs["reason"])
    assert result.trials == len(spec.modes) - 1  # every valid config measured once

    entry = result.entry
    assert entry is not None and entry.config["MODE"] in ("good", "good_wide")
    problem = key.problem()
    inputs = spec.make_inputs(problem, seed=99, device="cpu")
    with torch.no_grad():
        assert spec.check(inputs, spec.run(inputs, spec.parse(problem, entry.config))) is None


def test_a_key_whose_every_candidate_fails_says_why(sqlite_url):
    job = Job(kernels=["tuner.faulty_kernels:FAILING_SPEC"], ns=[24], dtypes=["float32"],
              m_buckets=[2], sampler="brute", trials=0, compile_timeout_s=60, run_timeout_s=4)
    report = JobRunner(job, sqlite_url, workers=1).run()
    (result,) = report.keys
    assert result.status == "failed" and result.entry is None
    assert result.reason.startswith("no candidate passed its check: wrong output: ")
    assert result.reason.endswith("; wrong output: output 0: 48 non-finite values")  # "nan"


def test_failures_are_listed_once_each_most_frequent_first() -> None:
    study = optuna.create_study()
    for reason in ("check: out of memory", "compile: x" * 100, "check: out of memory", "a", "b"):
        trial = study.ask()
        trial.set_user_attr("reason", reason)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    study.tell(study.ask(), 1.0)  # a measured one is no failure
    listed = failures(study, most=2, width=20)
    assert listed == "2 x check: out of memory; compile: xcompile: x; 2 more"
    assert failures(optuna.create_study()) == "none measured"
