"""The one-row Triton RMSNorm peer: what a Triton user writes first, after the layer-norm
tutorial. One program per row with the whole row in one next_pow2(N) block, 4 warps; the
backward writes each row's dw terms in fp32 to an M x N buffer that torch then sums.

Maths as in kerneltune's kernels (llama mode): y = w · (x · r).to(x.dtype) with
r = rsqrt(mean(x²) + eps); dx = r · (g − x̂ · mean(g · x̂)) with g = dy · w, x̂ = x · r;
dw = Σ_rows dy · x̂ rounded to x's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

WARPS = 4
#: Rows longer than this are not attempted: the block would not compile in useful time.
MAX_BLOCK = 65536


@triton.jit
def _fwd_kernel(X, W, Y, stride_x, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    y = w * (x * r).to(X.dtype.element_ty).to(tl.float32)
    tl.store(Y + row * N + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_kernel(DY, X, W, RSTD, DX, DW_ROWS, stride_dy, stride_x, N, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(RSTD + row)
    xhat = x * r
    g = dy * w
    dx = r * (g - xhat * (tl.sum(g * xhat, axis=0) / N))
    tl.store(DX + row * N + cols, dx.to(DX.dtype.element_ty), mask=mask)
    xhat_v = xhat.to(X.dtype.element_ty).to(tl.float32)
    tl.store(DW_ROWS + row * N + cols, dy * xhat_v, mask=mask)


def _block(n: int) -> int:
    block = triton.next_power_of_2(n)
    if block > MAX_BLOCK:
        raise ValueError(f"one-row block of {block} elements (rows of {n}): not attempted")
    return block


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    m, n = x.shape
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _fwd_kernel[(m,)](x, w, y, x.stride(0), n, eps, BLOCK=_block(n), num_warps=WARPS)
    return y


def rms_norm_backward(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, rstd: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    m, n = x.shape
    dx = torch.empty((m, n), dtype=x.dtype, device=x.device)
    dw_rows = torch.empty((m, n), dtype=torch.float32, device=x.device)
    _bwd_kernel[(m,)](dy, x, w, rstd, dx, dw_rows, dy.stride(0), x.stride(0), n,
                      BLOCK=_block(n), num_warps=WARPS)
    return dx, dw_rows.sum(0).to(w.dtype)
