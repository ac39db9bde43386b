"""A test-only kernel whose configs fail in every way a real candidate can.

The tuner loads it by reference (``"tuner.faulty_kernels:SPEC"``), as it would a plugin. The
kernel doubles its input, y = 2·x; its MODE parameter picks how a config behaves:

    good, good_wide   correct (one program per row, BLOCK the row or twice it)
    bad_arange        tl.arange over a non-power-of-two constexpr: Triton refuses to build it
    wrong             y = 2·x + 1: runs, but the check against the reference rejects it
    nan               scale NaN: non-finite output
    hang              the first call returns correctly, later calls (the timing) never return
    kill              SIGKILLs its own process
    cuda_fatal        raises the error text of a dead CUDA context
    hang_first        never returns, from the first call (the compile stage)
    invalid           rejected by `valid`: must never run

Any config whose JSON (sorted keys) is in the environment variable `WRONG_CONFIG` returns
y = 2·x + 1 as well: a config that passed one search and fails its re-timing in the next.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import time
from typing import ClassVar

import torch
import triton
import triton.language as tl

from kerneltune.kernels import KernelConfig, KernelSpec, Problem
from kerneltune.kernels._spec import generator, next_pow2, normal

MODES = ("good", "good_wide", "bad_arange", "wrong", "nan", "hang", "kill", "cuda_fatal",
         "hang_first", "invalid")
#: The modes a whole tuning job runs (the others are exercised on a single worker).
JOB_MODES = ("good", "good_wide", "bad_arange", "wrong", "nan", "hang", "kill", "invalid")

_calls: dict[str, int] = {}
#: The environment variable naming a config that runs wrong (`FaultySpec.run`).
WRONG_CONFIG = "KERNELTUNE_TEST_WRONG_CONFIG"


@triton.jit
def _scale_kernel(X, Y, N, scale, shift, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * N + cols, (x * scale + shift).to(Y.dtype.element_ty), mask=mask)


def _launch(x: torch.Tensor, block: int, scale: float = 2.0, shift: float = 0.0) -> torch.Tensor:
    y = torch.empty_like(x)
    _scale_kernel[(x.shape[0],)](x, y, x.shape[1], scale, shift, BLOCK=block)
    return y


@dataclasses.dataclass(frozen=True, repr=False, kw_only=True)
class FaultyConfig(KernelConfig):
    """How a config of the faulty kernel behaves (`MODES`)."""

    MODE: str


@dataclasses.dataclass(frozen=True, repr=False, kw_only=True)
class PaddedConfig(FaultyConfig):
    """A mode beside an inert parameter."""

    PAD: int


class FaultySpec(KernelSpec):
    name = "faulty_double"
    config_type: ClassVar[type[KernelConfig]] = FaultyConfig

    def __init__(self, modes: tuple[str, ...] = MODES) -> None:
        self.modes = modes

    def space(self, problem: Problem) -> dict[str, list]:
        return {"MODE": list(self.modes)}

    def valid(self, problem: Problem, config: FaultyConfig) -> bool:
        return config.MODE != "invalid"

    def default(self, problem: Problem) -> KernelConfig:
        return FaultyConfig(MODE="good")

    def make_inputs(self, problem: Problem, seed: int, device: str | torch.device) -> dict:
        g = generator(seed, device)
        return {"x": normal(g, problem.m, problem.n, dtype=problem.torch_dtype)}

    def run(self, inputs: dict, config: FaultyConfig) -> tuple[torch.Tensor, ...]:
        mode, x = config.MODE, inputs["x"]
        calls = _calls[mode] = _calls.get(mode, 0) + 1
        block = next_pow2(x.shape[1])
        if mode == "invalid":
            raise AssertionError("an invalid config was run")
        if json.dumps(config.to_json(), sort_keys=True) == os.environ.get(WRONG_CONFIG):
            return (_launch(x, block, shift=1.0),)
        if mode == "good_wide":
            return (_launch(x, 2 * block),)
        if mode == "bad_arange":
            return (_launch(x, 12),)
        if mode == "wrong":
            return (_launch(x, block, shift=1.0),)
        if mode == "nan":
            return (_launch(x, block, scale=math.nan),)
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "cuda_fatal":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if mode == "hang_first" or (mode == "hang" and calls > 1):
            while True:
                time.sleep(0.05)
        return (_launch(x, block),)

    def reference(self, inputs: dict) -> tuple[torch.Tensor, ...]:
        return (inputs["x"].double() * 2.0,)

    def bytes_moved(self, problem: Problem) -> int:
        return 2 * problem.m * problem.n * problem.itemsize


class FailingSpec(FaultySpec):
    """Only candidates that fail their check."""

    def default(self, problem: Problem) -> KernelConfig:
        return FaultyConfig(MODE="wrong")


class PaddedSpec(FaultySpec):
    """Correct modes beside an inert PAD: a space of several configs that all pass, so that a
    search can go on past its first trials."""

    config_type: ClassVar[type[KernelConfig]] = PaddedConfig

    def space(self, problem: Problem) -> dict[str, list]:
        return {"MODE": list(self.modes), "PAD": [0, 1, 2, 3]}

    def default(self, problem: Problem) -> KernelConfig:
        return PaddedConfig(MODE="good", PAD=0)


SPEC = FaultySpec()
JOB_SPEC = FaultySpec(JOB_MODES)
FAILING_SPEC = FailingSpec(("wrong", "nan"))
PADDED_SPEC = PaddedSpec(("good", "good_wide"))
