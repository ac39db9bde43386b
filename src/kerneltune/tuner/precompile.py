"""Compiling a batch of candidates in parallel before they are timed one at a time.

Triton compiles a config the first time it runs (about a second for these kernels), while timing
it takes a fraction of that: a tuner that compiles in its benchmark worker spends most of its
time compiling, one candidate after the other, with the GPU idle. A pool of processes on the same
GPU runs each candidate of a batch once on a small problem of the same specialisation (rows capped
at `ROWS`, which keeps the divisibility every power-of-two bucket has), filling Triton's on-disk
cache; the benchmark worker then loads the compiled kernel instead of building it.

Nothing here decides a candidate's fate: one that fails, crashes or hangs in the pool is left to
the benchmark worker, which reports it properly. A hang or a dead CUDA context only costs the
pool its processes, which are replaced.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import time
from collections.abc import Sequence
from multiprocessing.pool import AsyncResult, Pool
from typing import TYPE_CHECKING, Any

from kerneltune.table import Config
from kerneltune.tuner.protocol import is_fatal, problem_from_message

if TYPE_CHECKING:
    from kerneltune.kernels import KernelConfig

#: Rows of the problem a candidate is compiled on (the kernel's specialisation does not depend on
#: the row count beyond M == 1 and M % 16, which every bucket up to this keeps).
ROWS = 64


def _init(cuda_device: str | None, interpret: bool) -> None:
    if cuda_device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = cuda_device
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"


def _compile(spec_ref: str, problem: dict[str, Any], config: Config) -> str | None:
    """Run `config` (its JSON, as the benchmark worker gets it) once on a small problem; None
    on success, else why it failed."""
    import torch

    from kerneltune.env import on_gpu
    from kerneltune.tuner.job import resolve_spec

    try:
        spec = resolve_spec(spec_ref)
        small = problem_from_message(problem)
        small = dataclasses.replace(small, m=min(small.m, ROWS))
        device = "cuda" if on_gpu() else "cpu"
        spec.run(spec.make_inputs(small, 0, device), spec.config_type.from_json(config))
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception as e:  # reported by the benchmark worker when it runs the candidate
        return f"{type(e).__name__}: {str(e)[:300]}"
    return None


class Precompiler:
    """A pool of `processes` compiling candidates for one GPU (`cuda_device`, as
    CUDA_VISIBLE_DEVICES names it); `timeout_s` bounds one batch."""

    def __init__(self, processes: int, *, cuda_device: str | None = None,
                 interpret: bool = False, timeout_s: float = 300.0) -> None:
        if processes < 1:
            raise ValueError(f"a precompiler needs at least one process, got {processes}")
        self.processes, self.cuda_device = processes, cuda_device
        self.interpret, self.timeout_s = interpret, timeout_s
        self.restarts = 0
        self._pool: Pool | None = None

    def _get_pool(self) -> Pool:
        if self._pool is None:
            ctx = multiprocessing.get_context("spawn")  # no CUDA state inherited from a parent
            self._pool = ctx.Pool(self.processes, initializer=_init,
                                  initargs=(self.cuda_device, self.interpret))
        return self._pool

    def compile(self, spec_ref: str, problem: dict[str, Any], configs: Sequence[KernelConfig]
                ) -> list[str | None]:
        """Compile `configs` for `problem` (a worker problem message) in parallel.

        Returns per config None (compiled) or why not ("timeout" for one still running when the
        batch's time ran out). Never raises for a candidate's failure.
        """
        if not configs:
            return []
        pool = self._get_pool()
        pending: list[AsyncResult] = [
            pool.apply_async(_compile, (spec_ref, problem, c.to_json())) for c in configs]
        deadline = time.monotonic() + self.timeout_s
        out: list[str | None] = []
        for result in pending:
            result.wait(max(0.0, deadline - time.monotonic()))
            out.append(result.get() if result.ready() else "timeout")
        if any(r is not None and (r == "timeout" or is_fatal(r)) for r in out):
            self.reset()  # hung processes, or CUDA contexts no later candidate can use
        return out

    def reset(self) -> None:
        """Kill the pool's processes; the next batch starts fresh ones."""
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None
            self.restarts += 1

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool.join()
            self._pool = None

    def __enter__(self) -> Precompiler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
