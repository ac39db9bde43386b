"""The `KernelSpec` of `add_rmsnorm`: inputs, the float64 reference and the check, the search
space and the default config. They may change without making tuned tables stale: only the
device code's module, `kerneltune.kernels.add_rmsnorm`, is hashed into `kernel_hash`."""

from __future__ import annotations

from typing import ClassVar

import torch

from kerneltune.kernels import add_rmsnorm as device_code
from kerneltune.kernels._spec import (
    Config,
    Inputs,
    KernelSpec,
    Outputs,
    Problem,
    generator,
    normal,
)
from kerneltune.kernels.add_rmsnorm import add_rmsnorm_fwd
from kerneltune.kernels.rmsnorm_fwd_spec import (
    default_row_tiling,
    rmsnorm_fwd_ref,
    row_tiling_space,
    valid_row_tiling,
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


class AddRMSNormFwd(KernelSpec):
    name = "add_rmsnorm_fwd"
    kernel_module = device_code
    options: ClassVar[dict[str, tuple[float, ...]]] = {"offset": (0.0, 1.0)}

    def space(self, problem: Problem) -> dict[str, list]:
        return row_tiling_space(problem)

    def valid(self, problem: Problem, config: Config) -> bool:
        return valid_row_tiling(problem, config)

    def default(self, problem: Problem) -> Config:
        return default_row_tiling(problem)

    def make_inputs(self, problem: Problem, seed: int, device: str | torch.device) -> Inputs:
        g = generator(seed, device)
        dtype = problem.torch_dtype
        x = normal(g, problem.m, problem.n, dtype=dtype)
        residual = normal(g, problem.m, problem.n, dtype=dtype, std=2.0)
        w = normal(g, problem.n, dtype=dtype, mean=1.0, std=0.25)
        return {"x": x, "residual": residual, "weight": w, "eps": 1e-6,
                "offset": float(problem.option("offset", 0.0))}

    def run(self, inputs: Inputs, config: Config) -> Outputs:
        return add_rmsnorm_fwd(inputs["x"], inputs["residual"], inputs["weight"], inputs["eps"],
                               inputs["offset"], config)

    def reference(self, inputs: Inputs) -> Outputs:
        return add_rmsnorm_fwd_ref(inputs["x"], inputs["residual"], inputs["weight"],
                                   inputs["eps"], inputs["offset"])

    def bytes_moved(self, problem: Problem) -> int:
        m, n, s = problem.m, problem.n, problem.itemsize
        return 4 * m * n * s + n * s + 4 * m  # x, residual read; y, new residual written


SPEC = AddRMSNormFwd()
