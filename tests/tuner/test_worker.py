"""The benchmark worker process against real failing kernels (under the Triton interpreter)."""

from __future__ import annotations

import pytest

import kerneltune.tuner.timing as timing
from kerneltune.kernels import Problem
from kerneltune.tuner.bench_process import evaluate as evaluate_in_process
from kerneltune.tuner.protocol import is_fatal, problem_message
from kerneltune.tuner.worker import BenchmarkWorker

from .faulty_kernels import FaultyConfig

SPEC_REF = "tuner.faulty_kernels:SPEC"
PROBLEM = problem_message(Problem("faulty_double", 2, 24, "float32"))


@pytest.fixture(scope="module")
def worker():
    with BenchmarkWorker(interpret=True, name="test") as w:
        yield w


def evaluate(worker: BenchmarkWorker, mode: str, *, compile_timeout_s: float = 60.0,
             run_timeout_s: float = 30.0):
    return worker.evaluate(SPEC_REF, PROBLEM, FaultyConfig(MODE=mode), seed=7,
                           compile_timeout_s=compile_timeout_s, run_timeout_s=run_timeout_s)


def test_good_config_is_checked_and_timed(worker):
    out = evaluate(worker, "good")
    assert out.status == "ok", out.reason
    assert out.method == "interpreter"
    assert out.median_us is not None and out.median_us > 0
    assert min(out.samples_us) <= out.median_us <= max(out.samples_us)
    assert worker.hello["device"] == "triton-interpreter (cpu)"


@pytest.mark.parametrize(("mode", "status", "text"), [
    ("bad_arange", "compile_error", "power of 2"),
    ("wrong", "rejected", "wrong output"),
    ("nan", "rejected", "non-finite"),
])
def test_failing_config_keeps_the_worker(worker, mode, status, text):
    pid = worker.pid
    out = evaluate(worker, mode)
    assert out.status == status
    assert text in out.reason
    assert worker.pid == pid  # an ordinary failure does not cost a process


def test_fatal_cuda_error_replaces_the_process(worker):
    pid, restarts = worker.pid, worker.restarts
    out = evaluate(worker, "cuda_fatal")
    assert out.status == "error"
    assert is_fatal(out.reason) and "illegal memory access" in out.reason
    assert worker.pid != pid and worker.restarts == restarts + 1
    assert evaluate(worker, "good").ok


def test_hang_in_the_first_run_hits_the_compile_timeout(worker):
    pid = worker.pid
    out = evaluate(worker, "hang_first", compile_timeout_s=3.0)
    assert out.status == "timeout"
    assert out.reason == "compile timed out after 3 s"
    assert worker.pid != pid
    assert evaluate(worker, "good").ok


@pytest.mark.parametrize("fails", ["capture", "replay"])
def test_a_timing_failure_is_the_candidates_error_and_the_graph_is_captured_before_the_check(
        monkeypatch, fails):
    """In the worker's own code, in this process: the graph is captured before the float64
    check (`capture_config`), and a capture or a replay that raises ends the candidate with a
    timing error, not the worker."""
    from tuner.faulty_kernels import SPEC

    steps: list[str] = []
    real_capture, real_check = timing.capture_config, SPEC.check

    def capture(*args, **kwargs):
        steps.append("capture")
        if fails == "capture":
            raise RuntimeError("graph capture failed")
        real_capture(*args, **kwargs)

        def replay():
            steps.append("replay")
            raise RuntimeError("graph replay failed")
        return replay

    def check(*args, **kwargs):
        steps.append("check")
        return real_check(*args, **kwargs)

    monkeypatch.setattr(timing, "capture_config", capture)
    monkeypatch.setattr(SPEC, "check", check)
    request = {"spec": SPEC_REF, "problem": PROBLEM, "config": {"MODE": "good"}, "seed": 7}
    out = evaluate_in_process(request, "cpu", lambda message: None, {SPEC_REF: SPEC})
    assert out["status"] == "error" and not out["fatal"]
    assert out["reason"] == f"timing: RuntimeError: graph {fails} failed"
    assert steps == (["capture"] if fails == "capture" else ["capture", "check", "replay"])
