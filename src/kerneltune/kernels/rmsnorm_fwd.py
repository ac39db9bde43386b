"""RMSNorm forward: y = rmsnorm(x) · w, saving the per-row rstd for backward.

Maths (HF Llama RMSNorm is the reference)::

    r     = 1 / sqrt(mean(x², over N, in fp32) + eps)
    llama (offset = 0):  y = w · (x · r).to(x.dtype)          product in fp32, one cast
    gemma (offset ≠ 0):  y = (x · r · (offset + w)).to(x.dtype) all in fp32, one cast
    rstd  = r (fp32, one per row)

One program normalises ROWS rows. SINGLE keeps a whole row block in registers (BLOCK_N ≥ N);
otherwise the row is looped over in BLOCK_N chunks twice: once for the sum of squares, once
to normalise and store (the second read is served by L2 when EVICT keeps the row there).

With few long rows (M small, N large) one program per row leaves most of the GPU idle, so SPLIT > 1
cuts each row into SPLIT column ranges over two launches: the first writes each range's partial
sum of squares (fp32, M x SPLIT), the second sums a row's partials, then normalises its range (the
re-read of x is served by L2: such problems are small).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kerneltune.kernels._spec import (
    Config,
    launch_options,
)


@triton.jit
def _load_row_chunk(ptrs, mask, EVICT: tl.constexpr, POLICY: tl.constexpr):
    if EVICT:
        v = tl.load(ptrs, mask=mask, other=0.0, eviction_policy=POLICY)
    else:
        v = tl.load(ptrs, mask=mask, other=0.0)
    return v.to(tl.float32)


@triton.jit
def _normalize(x, r, w, offset, GEMMA: tl.constexpr, OUT: tl.constexpr):
    """llama: w · (x·r) rounded to OUT first; gemma: x·r·(offset + w) all in fp32."""
    if GEMMA:
        y = x * r * (offset + w)
    else:
        y = w * (x * r).to(OUT).to(tl.float32)
    return y.to(OUT)


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
        y = _normalize(x, r[:, None], w[None, :], offset, GEMMA, Y.dtype.element_ty)
        tl.store(y_rows + cols[None, :], y, mask=mask)
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
            y = _normalize(x, r[:, None], w[None, :], offset, GEMMA, Y.dtype.element_ty)
            tl.store(y_rows + c[None, :], y, mask=mask)
    tl.store(RSTD + rows, r, mask=row_ok)


@triton.jit
def _rmsnorm_fwd_split_sumsq_kernel(
    X, PART, stride_x, N, CHUNK, SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, EVICT: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(part * CHUNK, part * CHUNK + CHUNK, BLOCK_N):
        c = start + cols
        x = _load_row_chunk(X + row * stride_x + c, c < N, EVICT, "evict_last")
        acc += x * x
    tl.store(PART + row * SPLIT + part, tl.sum(acc, axis=0))


@triton.jit
def _rmsnorm_fwd_split_norm_kernel(
    X, W, Y, RSTD, PART, stride_x, stride_y, N, CHUNK, eps, offset,
    SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, GEMMA: tl.constexpr, EVICT: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    r = tl.rsqrt(tl.sum(tl.load(PART + row * SPLIT + tl.arange(0, SPLIT)), axis=0) / N + eps)
    cols = tl.arange(0, BLOCK_N)
    for start in range(part * CHUNK, part * CHUNK + CHUNK, BLOCK_N):
        c = start + cols
        mask = c < N
        x = _load_row_chunk(X + row * stride_x + c, mask, EVICT, "evict_first")
        w = tl.load(W + c, mask=mask, other=0.0).to(tl.float32)
        y = _normalize(x, r, w, offset, GEMMA, Y.dtype.element_ty)
        tl.store(Y + row * stride_y + c, y, mask=mask)
    if part == 0:
        tl.store(RSTD + row, r)


def rmsnorm_fwd(
    x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float, config: Config,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch on a (M, N) view with unit stride along N; returns y (M, N) and rstd (M,) fp32."""
    m, n = x.shape
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    rstd = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m == 0:
        return y, rstd
    split = int(config.get("SPLIT", 1))
    if split > 1:
        block = int(config["BLOCK_N"])
        chunk = triton.cdiv(triton.cdiv(n, split), block) * block
        part = torch.empty((m, split), dtype=torch.float32, device=x.device)
        common = {"SPLIT": split, "BLOCK_N": block, "EVICT": config["EVICT"],
                  **launch_options(config)}
        _rmsnorm_fwd_split_sumsq_kernel[(m, split)](x, part, x.stride(0), n, chunk, **common)
        _rmsnorm_fwd_split_norm_kernel[(m, split)](
            x, weight, y, rstd, part, x.stride(0), y.stride(0), n, chunk, eps, offset,
            GEMMA=offset != 0.0, **common,
        )
        return y, rstd
    rows = int(config["ROWS"])
    _rmsnorm_fwd_kernel[(triton.cdiv(m, rows),)](
        x, weight, y, rstd, x.stride(0), y.stride(0), m, n, eps, offset,
        BLOCK_N=config["BLOCK_N"], ROWS=rows, SINGLE=config["SINGLE"],
        GEMMA=offset != 0.0, EVICT=config["EVICT"], **launch_options(config),
    )
    return y, rstd
