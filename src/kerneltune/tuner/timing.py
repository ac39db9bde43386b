"""Timing kernels the way the hardware sees them.

GPU time is taken by CUDA-graph replay over rotating input sets that together exceed the L2
several times, so no call is served from cache and launch gaps do not hide a fast kernel; the
median over many replays is reported. Host overhead (eager back-to-back calls) is measured apart,
by `kerneltune.runtime.bench.per_call_us`. Under the Triton interpreter the wall-clock time of a
call is reported and labelled as such: it says nothing about a GPU and is never mixed with GPU
results.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kerneltune.kernels import Inputs, KernelConfig, KernelSpec, Problem
from kerneltune.tuner.protocol import TIMING_MS

#: Input sets rotate through at least this many times the L2 size.
L2_FACTOR = 4
#: At most this many kernel launches are captured in one graph.
MAX_LAUNCHES_PER_GRAPH = 512
#: Eager calls before capture: the first compiles and loads the kernel, and every set shares its
#: shapes and alignment, so a few warm the path; calling all 512 sets of a small problem would
#: cost more host time than the timing itself.
WARMUP_CALLS = 3


@dataclass(frozen=True)
class Timing:
    """Per-call times of one kernel (µs) and how they were taken."""

    median_us: float
    samples_us: list[float] = field(repr=False)
    method: str  # "cuda-graph" | "eager" | "interpreter"

    @classmethod
    def of(cls, samples_us: Sequence[float], method: str) -> Timing:
        return cls(statistics.median(samples_us), list(samples_us), method)

    @property
    def spread(self) -> float:
        """Relative spread of the samples (p90 - p10) / median: the noise of this measurement."""
        if len(self.samples_us) < 5:
            return 0.0
        q = statistics.quantiles(self.samples_us, n=10)
        return (q[-1] - q[0]) / self.median_us if self.median_us > 0 else math.inf


def l2_bytes(device: str | torch.device = "cuda") -> int:
    return int(torch.cuda.get_device_properties(torch.device(device)).L2_cache_size)


def rotation_count(bytes_per_set: int, device: str | torch.device = "cuda") -> int:
    """How many input sets make the rotation exceed `L2_FACTOR` × the L2."""
    need = math.ceil(L2_FACTOR * l2_bytes(device) / max(1, bytes_per_set))
    return max(1, min(need, MAX_LAUNCHES_PER_GRAPH))


def clone_inputs(inputs: Inputs) -> Inputs:
    """A copy with fresh device memory for each tensor (the same values)."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def graph_time(
    call: Callable[[int], Any], n_sets: int, *, budget_ms: float = TIMING_MS, min_replays: int = 10,
) -> Timing:
    """Median per-call GPU time of `call(i)` over the sets i < n_sets, by CUDA-graph replay."""
    return replay_time(capture_graph(call, n_sets), n_sets, budget_ms=budget_ms,
                       min_replays=min_replays)


def capture_graph(call: Callable[[int], Any], n_sets: int) -> torch.cuda.CUDAGraph:
    """One graph that launches `call(i)` once per set i < n_sets, after a few eager calls."""
    for i in range(min(n_sets, WARMUP_CALLS)):
        call(i)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for i in range(n_sets):
            call(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    return graph


def replay_time(graph: torch.cuda.CUDAGraph, n_sets: int, *, budget_ms: float = TIMING_MS,
                min_replays: int = 10) -> Timing:
    """Median per-call GPU time of a graph from `capture_graph`: each replay is one sample,
    divided by its n_sets launches."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    one_ms = max(start.elapsed_time(end), 1e-3)
    replays = max(min_replays, min(2000, int(budget_ms / one_ms)))

    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(replays)]
    for s, e in events:
        s.record()
        graph.replay()
        e.record()
    torch.cuda.synchronize()
    return Timing.of([s.elapsed_time(e) * 1e3 / n_sets for s, e in events], "cuda-graph")


def interpreter_time(call: Callable[[], Any], *, repeats: int = 3) -> Timing:
    """Wall-clock time of a call under the Triton interpreter (CPU): labelled, never a GPU's."""
    call()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        samples.append((time.perf_counter() - t0) * 1e6)
    return Timing.of(samples, "interpreter")


def rotating_inputs(
    spec: KernelSpec, problem: Problem, *, device: str, seed: int = 0
) -> list[Inputs]:
    first = spec.make_inputs(problem, seed, device)
    n = rotation_count(spec.bytes_moved(problem), device)
    return [first] + [clone_inputs(first) for _ in range(n - 1)]


def time_config(
    spec: KernelSpec, problem: Problem, config: KernelConfig, *, device: str, seed: int = 0,
    budget_ms: float = TIMING_MS, input_sets: list[Inputs] | None = None,
) -> Timing:
    """Time one config of a kernel on a problem: graph replay on a GPU, wall clock on a CPU.

    `input_sets` lets callers time several configs over the same rotation (fair comparisons, and
    no re-allocation per candidate).
    """
    return capture_config(spec, problem, config, device=device, seed=seed, budget_ms=budget_ms,
                          input_sets=input_sets)()


def capture_config(
    spec: KernelSpec, problem: Problem, config: KernelConfig, *, device: str, seed: int = 0,
    budget_ms: float = TIMING_MS, input_sets: list[Inputs] | None = None,
) -> Callable[[], Timing]:
    """`time_config` in two steps: the graph is captured now, and replayed and timed when the
    returned function is called (under the interpreter, both happen then).

    A caller that checks the config's output captures before the check: a graph captured after
    the float64 check of a multi-GB problem could get its outputs placed where every kernel ran
    measurably slower than in eager calls.
    """
    if not str(device).startswith("cuda"):
        inputs = spec.make_inputs(problem, seed, device)
        return lambda: interpreter_time(lambda: spec.run(inputs, config))
    sets = input_sets if input_sets is not None else rotating_inputs(
        spec, problem, device=device, seed=seed)
    graph = capture_graph(lambda i: spec.run(sets[i], config), len(sets))
    return lambda: replay_time(graph, len(sets), budget_ms=budget_ms)


def copy_bandwidth_gbps(device: str = "cuda", *, nbytes: int = 2 << 30) -> float | None:
    """The device's measured copy bandwidth, counting bytes read plus bytes written (GB/s).

    The best of a plain device-to-device copy (which a graph may route through a copy engine)
    and an elementwise kernel over 16-bit values (the SMs' own loads and stores): the ceiling a
    memory-bound kernel is held against. None on a CPU: no GPU ceiling to hold kernels against.
    """
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return None
    return 2 * (nbytes // 4) * 2 / (copy_time_us(nbytes, device) * 1e-6) / 1e9


def copy_time_us(nbytes: int, device: str = "cuda") -> float:
    """GPU time of a copy that reads and writes `nbytes` in total (µs), timed as kernels are:
    graph replay over rotating buffers that exceed the L2, the best of `copy_` and an SM
    elementwise copy. At a kernel's own byte count this is the ceiling at that size, where
    launch and tail latency weigh in (a 64 MB copy reaches 85% of the peak on an H200)."""
    half = max(1, nbytes // 4)  # bf16 elements of the source
    n_sets = rotation_count(4 * half, device)
    src = [torch.empty(half, dtype=torch.bfloat16, device=device).normal_()
           for _ in range(n_sets)]
    dst = [torch.empty_like(t) for t in src]
    copies = [lambda i: dst[i].copy_(src[i]), lambda i: torch.neg(src[i], out=dst[i])]
    return min(graph_time(c, n_sets, budget_ms=100.0, min_replays=20).median_us
               for c in copies)
