"""Fused residual add + RMSNorm as a tuning target: inputs, float64 reference, space, default.

Not hashed (see `kerneltune.kernels`): the device code is in `kerneltune.kernels.add_rmsnorm`.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from kerneltune.kernels import add_rmsnorm as device_code
from kerneltune.kernels._config import RowTilingConfig
from kerneltune.kernels._spec import (
    Inputs,
    Outputs,
    Problem,
    generator,
    normal,
)
from kerneltune.kernels.add_rmsnorm import add_rmsnorm_fwd
from kerneltune.kernels.rmsnorm_fwd_spec import (
    FORWARD_PERSISTENT,
    Persistent,
    RowTiled,
    Split,
    rmsnorm_fwd_ref,
)


def add_rmsnorm_fwd_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
    offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Plain torch: the sum exactly as the kernel rounds it (fp32 add, one cast to x's dtype),
    then the float64 RMSNorm reference on it."""
    s = (x.float() + residual.float()).to(x.dtype)
    y, rstd = rmsnorm_fwd_ref(s, weight, eps, offset)
    return y, s, rstd


class AddRMSNormFwd(RowTiled):
    name = "add_rmsnorm_fwd"
    kernel_module = device_code
    options: ClassVar[dict[str, tuple[float, ...]]] = {"offset": (0.0, 1.0)}
    row_inputs: ClassVar[tuple[str, ...]] = ("x", "residual")
    #: One row a block (two were much slower), from 131072 on: there a split beat the looped
    #: kernel, where at 65536 the two were level.
    long_row_split: ClassVar[Split] = (8192, 1, 8, 1, 1)
    long_rows: ClassVar[int] = 131072
    #: As the forward's: its whole row is the forward's with a second input and output.
    persistent: ClassVar[bool] = True
    persistent_candidates: ClassVar[tuple[Persistent, ...]] = FORWARD_PERSISTENT

    def make_inputs(self, problem: Problem, seed: int, device: str | torch.device) -> Inputs:
        g = generator(seed, device)
        dtype = problem.torch_dtype
        x = normal(g, problem.m, problem.n, dtype=dtype)
        residual = normal(g, problem.m, problem.n, dtype=dtype, std=2.0)
        w = normal(g, problem.n, dtype=dtype, mean=1.0, std=0.25)
        return {"x": x, "residual": residual, "weight": w, "eps": 1e-6,
                "offset": float(problem.option("offset", 0.0))}

    def run(self, inputs: Inputs, config: RowTilingConfig) -> Outputs:
        return add_rmsnorm_fwd(inputs["x"], inputs["residual"], inputs["weight"], inputs["eps"],
                               inputs["offset"], config)

    def reference(self, inputs: Inputs) -> Outputs:
        return add_rmsnorm_fwd_ref(inputs["x"], inputs["residual"], inputs["weight"],
                                   inputs["eps"], inputs["offset"])

    def bytes_moved(self, problem: Problem) -> int:
        m, n, s = problem.m, problem.n, problem.itemsize
        return 4 * m * n * s + n * s + 4 * m  # x, residual read; y, new residual written


SPEC = AddRMSNormFwd()
