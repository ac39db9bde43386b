"""What the tuner and its benchmark worker processes say to each other.

The parent (`kerneltune.tuner.worker`) and the child (`kerneltune.tuner.bench_process`) talk in
JSON lines over the child's stdin and stdout:

    child  -> parent  {"type": "ready", "device": ..., "pid": ...}     once, when it has started
    parent -> child   {"op": "eval", "spec": ref, "problem": {...}, "config": {...}, "seed": s,
                       "timing_ms": t}                  (config: the typed config's `to_json`)
    child  -> parent  {"type": "compiled"}                             after the first run returns
    child  -> parent  {"type": "result", "status": ..., "median_us": ..., "reason": ...,
                       "fatal": ...}
    parent -> child   {"op": "info"}    answered by {"type": "info", "device": ..., ...}
    parent -> child   {"op": "exit"}

Both sides read these definitions, so they live apart from either. The module needs nothing but
the standard library: the `kerneltune` command imports it on every start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kerneltune.kernels import Problem

#: Error text after which a CUDA context is unusable: the process must be replaced.
FATAL_MARKERS = (
    "illegal memory access",
    "unspecified launch failure",
    "cuda error",
    "misaligned address",
    "device-side assert",
    "an illegal instruction",
)

#: What can become of a candidate: a result's "status".
STATUSES = ("ok", "rejected", "compile_error", "error", "timeout", "crash")

#: GPU milliseconds of graph replays per candidate timing, unless the job says otherwise.
TIMING_MS = 60.0


def is_fatal(text: str) -> bool:
    """Whether an error's text says the CUDA context it happened in is dead."""
    low = text.lower()
    return any(marker in low for marker in FATAL_MARKERS)


def problem_message(problem: Problem) -> dict[str, Any]:
    """A `Problem` as the JSON the worker takes."""
    return {"kernel": problem.kernel, "m": problem.m, "n": problem.n, "dtype": problem.dtype,
            "options": [list(kv) for kv in problem.options]}


def problem_from_message(p: dict[str, Any]) -> Problem:
    """The `Problem` a worker problem message stands for."""
    from kerneltune.kernels import Problem  # torch: only the processes that run kernels need it

    return Problem(p["kernel"], p["m"], p["n"], p["dtype"],
                   tuple(tuple(kv) for kv in p.get("options", ())))
