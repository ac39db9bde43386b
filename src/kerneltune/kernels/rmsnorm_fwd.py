"""RMSNorm forward: y = rmsnorm(x) · w, saving the per-row rstd for backward.

Maths (HF Llama RMSNorm is the reference)::

    r     = 1 / sqrt(mean(x², over N, in fp32) + eps)
    llama (offset = 0):  y = w · (x · r).to(x.dtype)          product in fp32, one cast
    gemma (offset ≠ 0):  y = (x · r · (offset + w)).to(x.dtype) all in fp32, one cast
    rstd  = r (fp32, one per row)

One program normalises ROWS rows. SINGLE keeps a whole row block in registers (BLOCK_N ≥ N);
otherwise the row is looped over in BLOCK_N chunks twice: once for the sum of squares, once
to normalise and store (the second read is served by L2 when EVICT keeps the row there).

COOP splits each row over ⌈N / BLOCK_N⌉ cooperating programs (`kerneltune.kernels._coop`), each
holding its chunk in registers: x is read once whatever N, and few rows still fill the GPU. The
row's chunks agree once, on r.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kerneltune.kernels import _coop, _coop_norm
from kerneltune.kernels._coop import lane_barrier, load_rows
from kerneltune.kernels._coop_norm import lane_rstd
from kerneltune.kernels._spec import (
    Config,
    launch_options,
    next_pow2,
)
from kerneltune.kernels.rmsnorm_bwd import sm_count

#: Shared Triton functions this module calls: hashed with it.
DEVICE_CODE_FROM = (_coop, _coop_norm)


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
def _rmsnorm_fwd_coop_kernel(
    X, W, Y, RSTD, PART, ARRIVED,
    stride_x, stride_y, M, N, eps, offset, NQ,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, NQ_POW2: tl.constexpr, PHASE: tl.constexpr,
    GEMMA: tl.constexpr, EVICT: tl.constexpr,
):
    """COOP (see `kerneltune.kernels._coop`) over NQ chunks: a row's chunks agree once, on the
    sum of squares (PART[row, q]); ARRIVED[lane] counts the lane's arrivals, NQ per row block.
    PHASE 0 does it all in one launch; PHASE 1 and 2 are its steps apart: the partial sums,
    the stores."""
    pid = tl.program_id(0)
    lane = pid // NQ
    n_lanes = tl.num_programs(0) // NQ
    q = pid % NQ
    cols = q * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    x_next = load_rows(X, lane, cols, col_ok, stride_x, M, ROWS, EVICT)
    for rb in range(lane, tl.cdiv(M, ROWS), n_lanes):
        # The next block's loads are issued before this block waits for its lane.
        x = x_next.to(tl.float32)
        x_next = load_rows(X, rb + n_lanes, cols, col_ok, stride_x, M, ROWS, EVICT)
        rows = rb * ROWS + tl.arange(0, ROWS)
        row_ok = rows < M
        if PHASE <= 1:
            tl.store(PART + rows * NQ + q, tl.sum(x * x, axis=1), mask=row_ok)
        if PHASE == 0:
            lane_barrier(ARRIVED, lane, ((rb - lane) // n_lanes + 1) * NQ)
        if PHASE != 1:
            r = lane_rstd(PART, RSTD, rows, row_ok, q, N, eps, NQ, NQ_POW2)
            y = _normalize(x, r[:, None], w[None, :], offset, GEMMA, Y.dtype.element_ty)
            tl.store(Y + rows.to(tl.int64)[:, None] * stride_y + cols[None, :], y,
                     mask=row_ok[:, None] & col_ok[None, :])


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
    if config["COOP"]:
        block = int(config["BLOCK_N"])
        chunks, sms = triton.cdiv(n, block), sm_count(x.device)
        grid = _coop.lanes(m, rows, chunks, sms)
        part = torch.empty((m, chunks), dtype=torch.float32, device=x.device)
        arrived = torch.zeros((grid,), dtype=torch.int32, device=x.device)
        for phase in _coop.phases(chunks, sms, steps=1):
            _rmsnorm_fwd_coop_kernel[(grid * chunks,)](
                x, weight, y, rstd, part, arrived, x.stride(0), y.stride(0), m, n, eps, offset,
                chunks, BLOCK_N=block, ROWS=rows, NQ_POW2=next_pow2(chunks), PHASE=phase,
                GEMMA=offset != 0.0, EVICT=config["EVICT"], **launch_options(config),
            )
        return y, rstd
    _rmsnorm_fwd_kernel[(triton.cdiv(m, rows),)](
        x, weight, y, rstd, x.stride(0), y.stride(0), m, n, eps, offset,
        BLOCK_N=config["BLOCK_N"], ROWS=rows, SINGLE=config["SINGLE"],
        GEMMA=offset != 0.0, EVICT=config["EVICT"], **launch_options(config),
    )
    return y, rstd
