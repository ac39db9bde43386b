"""RMSNorm forward: y = rmsnorm(x) · w, saving the per-row rstd for backward.

Maths (HF Llama RMSNorm is the reference)::

    r     = 1 / sqrt(mean(x², over N, in fp32) + eps)
    llama (offset = 0):  y = w · (x · r).to(x.dtype)          product in fp32, one cast
    gemma (offset ≠ 0):  y = (x · r · (offset + w)).to(x.dtype) all in fp32, one cast
    rstd  = r (fp32, one per row)

One program normalises ROWS rows. SINGLE keeps a whole row block in registers (BLOCK_N ≥ N);
otherwise the row is looped over in BLOCK_N chunks twice: once for the sum of squares, once
to normalise and store (the second read is served by L2 when EVICT keeps the row there).
"""

from __future__ import annotations

from typing import ClassVar

import torch
import triton
import triton.language as tl

from kerneltune.kernels._spec import (
    MAX_BLOCK_ELEMS,
    NUM_STAGES,
    NUM_WARPS,
    Config,
    Inputs,
    KernelSpec,
    Outputs,
    Problem,
    launch_options,
    next_pow2,
    pow2_range,
)

ROWS_CHOICES = (1, 2, 4, 8, 16)


@triton.jit
def _load_row_chunk(ptrs, mask, EVICT: tl.constexpr, POLICY: tl.constexpr):
    if EVICT:
        v = tl.load(ptrs, mask=mask, other=0.0, eviction_policy=POLICY)
    else:
        v = tl.load(ptrs, mask=mask, other=0.0)
    return v.to(tl.float32)


@triton.jit
def _rmsnorm_fwd_kernel(
    X, W, Y, RSTD,
    stride_x, stride_y, M, N,
    eps, offset,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, SINGLE: tl.constexpr,
    GEMMA: tl.constexpr, EVICT: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < M
    rows = rows.to(tl.int64)
    x_rows = X + rows[:, None] * stride_x
    y_rows = Y + rows[:, None] * stride_y
    cols = tl.arange(0, BLOCK_N)
    if SINGLE:
        mask = row_ok[:, None] & (cols[None, :] < N)
        x = _load_row_chunk(x_rows + cols[None, :], mask, EVICT, "evict_first")
        r = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
        w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)
        xhat = x * r[:, None]
        if GEMMA:
            y = xhat * (offset + w[None, :])
        else:
            y = w[None, :] * xhat.to(Y.dtype.element_ty).to(tl.float32)
        tl.store(y_rows + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            mask = row_ok[:, None] & (c[None, :] < N)
            x = _load_row_chunk(x_rows + c[None, :], mask, EVICT, "evict_last")
            acc += x * x
        r = tl.rsqrt(tl.sum(acc, axis=1) / N + eps)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            mask = row_ok[:, None] & (c[None, :] < N)
            x = _load_row_chunk(x_rows + c[None, :], mask, EVICT, "evict_first")
            w = tl.load(W + c, mask=c < N, other=0.0).to(tl.float32)
            xhat = x * r[:, None]
            if GEMMA:
                y = xhat * (offset + w[None, :])
            else:
                y = w[None, :] * xhat.to(Y.dtype.element_ty).to(tl.float32)
            tl.store(y_rows + c[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows, r, mask=row_ok)


def rmsnorm_fwd(
    x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float, config: Config,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch on a (M, N) view with unit stride along N; returns y (M, N) and rstd (M,) fp32."""
    m, n = x.shape
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    rstd = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m == 0:
        return y, rstd
    rows = int(config["ROWS"])
    _rmsnorm_fwd_kernel[(triton.cdiv(m, rows),)](
        x, weight, y, rstd, x.stride(0), y.stride(0), m, n, eps, offset,
        BLOCK_N=config["BLOCK_N"], ROWS=rows, SINGLE=config["SINGLE"],
        GEMMA=offset != 0.0, EVICT=config["EVICT"], **launch_options(config),
    )
    return y, rstd


def rmsnorm_fwd_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch in float64, with the one intermediate rounding the semantics prescribe."""
    x64 = x.double()
    r = torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    if offset != 0.0:
        y = x64 * r * (offset + weight.double())
    else:
        y = weight.double() * (x64 * r).to(x.dtype).double()
    return y, r.squeeze(-1)


class RMSNormFwd(KernelSpec):
    name = "rmsnorm_fwd"
    options: ClassVar[dict[str, tuple[float, ...]]] = {"offset": (0.0, 1.0)}

    def space(self, problem: Problem) -> dict[str, list]:
        return {
            "BLOCK_N": pow2_range(16, max(16, min(next_pow2(problem.n), 65536))),
            "SINGLE": [True, False],
            "ROWS": [r for r in ROWS_CHOICES if r <= next_pow2(problem.m)],
            "EVICT": [True, False],
            "num_warps": list(NUM_WARPS),
            "num_stages": list(NUM_STAGES),
        }

    def valid(self, problem: Problem, config: Config) -> bool:
        return valid_row_tiling(problem, config)

    def default(self, problem: Problem) -> Config:
        return default_row_tiling(problem)

    def make_inputs(self, problem: Problem, seed: int, device: str | torch.device) -> Inputs:
        g = torch.Generator(device="cpu").manual_seed(seed)
        x = torch.randn(problem.m, problem.n, generator=g).to(device, problem.torch_dtype)
        w = (1.0 + 0.25 * torch.randn(problem.n, generator=g)).to(device, problem.torch_dtype)
        return {"x": x, "weight": w, "eps": 1e-6, "offset": float(problem.option("offset", 0.0))}

    def run(self, inputs: Inputs, config: Config) -> Outputs:
        return rmsnorm_fwd(inputs["x"], inputs["weight"], inputs["eps"], inputs["offset"], config)

    def reference(self, inputs: Inputs) -> Outputs:
        return rmsnorm_fwd_ref(inputs["x"], inputs["weight"], inputs["eps"], inputs["offset"])

    def bytes_moved(self, problem: Problem) -> int:
        m, n, s = problem.m, problem.n, problem.itemsize
        return 2 * m * n * s + n * s + 4 * m


# ------------------------------------------------------- row tiling shared by the family


def valid_row_tiling(problem: Problem, config: Config) -> bool:
    """Constraints of the (BLOCK_N, SINGLE, ROWS, num_warps, num_stages) row-tiling space.

    SINGLE needs the row block to cover N; looping needs more than one chunk; a program's
    register block is bounded (larger ones spill); every warp must have elements to work on;
    pipelining stages only matter in a loop.
    """
    block, rows, warps = int(config["BLOCK_N"]), int(config["ROWS"]), int(config["num_warps"])
    npow = max(16, next_pow2(problem.n))
    if config["SINGLE"]:
        if block != npow or config["num_stages"] != 1:
            return False
    elif block >= problem.n:
        return False
    if block * rows > MAX_BLOCK_ELEMS * (2 if config["SINGLE"] else 1):
        return False
    if rows > 1 and rows * problem.n > 16384:
        return False  # several rows per program only pay off for short rows
    return warps == 1 or block * rows >= 32 * warps * 2


def default_row_tiling(problem: Problem) -> Config:
    """The common heuristic: whole row in registers up to 8K elements, 4K chunks beyond;
    warps grow with the block; short rows pack several per program."""
    npow = max(16, next_pow2(problem.n))
    single = npow <= 8192
    block = npow if single else 4096
    rows = 1
    while single and rows < 16 and rows * 2 * npow <= 2048 and rows * 2 <= next_pow2(problem.m):
        rows *= 2
    elems = block * rows
    warps = 1 if elems <= 256 else 2 if elems <= 512 else 4 if elems <= 2048 else 8
    return {"BLOCK_N": block, "SINGLE": single, "ROWS": rows, "EVICT": True,
            "num_warps": warps, "num_stages": 1 if single else 2}


SPEC = RMSNormFwd()
