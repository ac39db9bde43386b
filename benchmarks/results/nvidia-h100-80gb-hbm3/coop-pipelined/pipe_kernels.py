"""Cooperative splits of one row a block whose next blocks Triton's software pipeliner loads
ahead into shared memory (`tl.range(..., num_stages=STAGES)`), for the probe beside it.

The shipped splits gather their partials in a `while` loop (`kerneltune.kernels._coop.gather`),
which keeps the gathered tile in its own small layout but stops the pipeliner: a loop holding
another loop is not pipelined. With one row a block the partials reduce to a scalar, which has
no layout to propagate, so the polling read can stand alone and the row loop is pipelined.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kerneltune.kernels._coop import _read, lane_chunk, load_rows, publish
from kerneltune.kernels._coop_pair import _read_pair
from kerneltune.kernels.rmsnorm_fwd import _normalize
from kerneltune.kernels.rmsnorm_quant import _affine, _normed, _quantise, _row_scale


@triton.jit
def fwd_pipe_kernel(PART, NQ, X, W, Y, RSTD, stride_x, stride_y, M, N, eps, offset,
                    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, NQ_POW2: tl.constexpr,
                    PHASE: tl.constexpr, GEMMA: tl.constexpr, EVICT: tl.constexpr,
                    STAGES: tl.constexpr):
    lane, n_lanes, q, cols, col_ok = lane_chunk(NQ, N, BLOCK_N)
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    x = load_rows(X, lane, cols, col_ok, stride_x, M, 1, EVICT).to(tl.float32)
    if PHASE <= 1:
        publish(PART, lane, q, NQ, M, tl.sum(x * x, axis=1), 1)
    qs = tl.arange(0, NQ_POW2)
    for rb in tl.range(lane, M, n_lanes, num_stages=STAGES):
        x_ahead = load_rows(X, rb + n_lanes, cols, col_ok, stride_x, M, 1, EVICT).to(tl.float32)
        if PHASE <= 1:
            publish(PART, rb + n_lanes, q, NQ, M, tl.sum(x_ahead * x_ahead, axis=1), 1)
        if PHASE != 1:
            parts = _read(PART + rb * NQ + qs, qs < NQ, PHASE == 0)
            r = tl.rsqrt(tl.sum(parts) / N + eps)
            tl.store(RSTD + rb + qs * 0, r + qs * 0.0, mask=(qs == 0) & ((qs * 0 + q) == 0))
            y = _normalize(x, r, w[None, :], offset, GEMMA, Y.dtype.element_ty)
            rows = (rb + tl.arange(0, 1)).to(tl.int64)
            tl.store(Y + rows[:, None] * stride_y + cols[None, :], y, mask=col_ok[None, :])
        x = x_ahead


@triton.jit
def _store_row(Q, SCALE, y, amax, row, q, qs, cols, col_ok, stride_q, M, eps, min_scale,
               MODE: tl.constexpr, QMAX: tl.constexpr, SOFT_ROUND: tl.constexpr):
    """Row `row`'s chunk y (1, BLOCK_N) quantised with the row's max|y| (a scalar) and stored,
    the scale by chunk 0; a row before the first stores nothing."""
    ok = ((qs * 0 + row) >= 0) & ((qs * 0 + row) < M)
    chunk_ok = col_ok & ((cols * 0 + row) >= 0) & ((cols * 0 + row) < M)
    scale, mul = _row_scale(amax + qs * 0.0, eps, min_scale, MODE, QMAX)
    s1 = tl.max(scale, axis=0)
    m1 = tl.max(mul, axis=0) + tl.zeros([1], dtype=tl.float32)
    qv = _quantise(y.to(tl.float32), m1, s1 + tl.zeros([1], dtype=tl.float32), MODE, QMAX,
                   Q.dtype.element_ty, SOFT_ROUND)
    rows = (row + tl.arange(0, 1)).to(tl.int64)
    tl.store(Q + rows[:, None] * stride_q + cols[None, :], qv, mask=chunk_ok[None, :])
    tl.store(SCALE + row + qs * 0, scale, mask=(qs == 0) & ((qs * 0 + q) == 0) & ok)


@triton.jit
def quant_pipe_kernel(
    PART_SQ, PART_MAX, NQ, X, W, B, Q, SCALE, stride_x, stride_q, M, N, eps, min_scale,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, NQ_POW2: tl.constexpr, PHASE: tl.constexpr,
    EVICT: tl.constexpr, MODE: tl.constexpr, QMAX: tl.constexpr, HAS_W: tl.constexpr,
    HAS_B: tl.constexpr, SOFT_ROUND: tl.constexpr, STAGES: tl.constexpr,
):
    lane, n_lanes, q, cols, col_ok = lane_chunk(NQ, N, BLOCK_N)
    dtype = X.dtype.element_ty
    w, b = _affine(W, B, cols, N, HAS_W, HAS_B)
    x = load_rows(X, lane, cols, col_ok, stride_x, M, 1, EVICT)
    if PHASE <= 1:
        xf = x.to(tl.float32)
        publish(PART_SQ, lane, q, NQ, M, tl.sum(xf * xf, axis=1), 1)
    qs = tl.arange(0, NQ_POW2)
    y_prev = tl.zeros([1, BLOCK_N], dtype=dtype)
    for rb in tl.range(lane, M, n_lanes, num_stages=STAGES):
        x_ahead = load_rows(X, rb + n_lanes, cols, col_ok, stride_x, M, 1, EVICT)
        if PHASE <= 1:
            xf = x_ahead.to(tl.float32)
            publish(PART_SQ, rb + n_lanes, q, NQ, M, tl.sum(xf * xf, axis=1), 1)
        if PHASE != 1:
            prev = rb - n_lanes
            if PHASE == 2:
                sq_parts = _read(PART_SQ + rb * NQ + qs, qs < NQ, False)
                max_prev = sq_parts
            else:
                sq_parts, max_prev = _read_pair(PART_SQ + rb * NQ + qs, qs < NQ,
                                                PART_MAX + prev * NQ + qs,
                                                (qs < NQ) & ((qs * 0 + prev) >= 0), PHASE == 0)
            r = tl.rsqrt(tl.sum(sq_parts) / N + eps) + tl.zeros([1], dtype=tl.float32)
            y = _normed(x.to(tl.float32), r, w, b, MODE, HAS_W, HAS_B, dtype, SOFT_ROUND)
            if PHASE <= 2:
                publish(PART_MAX, rb, q, NQ, M, tl.max(tl.abs(y), axis=1), 1)
            if PHASE != 2:
                _store_row(Q, SCALE, y_prev, tl.max(max_prev), prev, q, qs, cols, col_ok,
                           stride_q, M, eps, min_scale, MODE, QMAX, SOFT_ROUND)
            y_prev = y.to(dtype)
        x = x_ahead
    if PHASE == 0 or PHASE == 3:
        last = lane + (M - 1 - lane) // n_lanes * n_lanes
        max_last = _read(PART_MAX + last * NQ + qs, qs < NQ, PHASE == 0)
        _store_row(Q, SCALE, y_prev, tl.max(max_last), last, q, qs, cols, col_ok, stride_q, M,
                   eps, min_scale, MODE, QMAX, SOFT_ROUND)
