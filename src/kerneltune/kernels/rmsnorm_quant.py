"""RMSNorm forward fused with per-row dynamic quantisation: int8, fp8 e4m3, or int8 fake-quant.

Per row of N elements; int8 and fp8 are vLLM's per-token dynamic quantisation of the llama-mode
output, fake an int8 simulation whose output is dequantised in the input dtype::

    r = 1 / sqrt(mean(x², over N, in fp32) + eps)     as in the forward
    y = (w · (x · r).to(x.dtype)).to(x.dtype)         products in fp32, y as the forward returns it
    int8:  s = max(max|y| / 127, 2^-23)               2^-23 = torch.finfo(float32).eps
           q = int8(clamp(rne(y · (1/s)), -128, 127)) rne: round half to even
    fp8:   s = max(max|y| / 448, 1 / (448 · 512))
           q = e4m3fn(clamp(y · (1/s), -448, 448))    the cast rounds to nearest even
    returns q (M, N) and s (M,) fp32: y ≈ q · s

    fake:  z     = x · r [· gain] [+ bias]            all in fp32, gain and bias optional
           scale = 127 / max(max|z|, eps)
           out   = (clamp(rne(z · scale), -128, 127) · (1/scale)).to(x.dtype)
    returns out (M, N) in x's dtype and scale (M,) fp32: z ≈ out = q / scale

Each per-row division is one IEEE division a row and a multiply an element, as in vLLM;
·(1/scale) is within one fp32 ulp of /scale before the final rounding.

Design: a program takes ROWS rows.

- SINGLE: whole rows in registers, so max|y| costs nothing; one power-of-two block, or two
  (PARTS = 2, `row_parts`: BLOCK_N and a TAIL) where padding to one would leave idle lanes that
  still issue every instruction. May run on a persistent grid (GRID_MULT > 1, registers capped
  by `kerneltune.kernels._coop.resident_options`), as the forward's may, each program loading
  its next row block while it quantises this one, its weight loaded once.
- Looped: three passes over the row (the sum of squares; y and its running max; y again,
  quantised and stored). x is re-read rather than y spilled, which would add a write and a
  read of M·N elements: with EVICT the first two passes keep x in L2 (evict_last) and the last
  lets it go, so DRAM sees x once and q once.
- COOP: each row split over cooperating programs (`kerneltune.kernels._coop`), whose chunks
  agree twice, on r and then on the scale; with one row a block Triton pipelines the row loop
  (`kerneltune.kernels._coop_row`).

Where one program holds or loops over whole rows, q may be stored in x's layout (X_LAYOUT,
`_store_q` says why); neither layout wins at every shape, so the search picks it per key. On
sm_90 and later the one-launch kernel is a programmatic dependent launch unless its programs
loop over row blocks (`kerneltune.kernels._spec.overlaps_row_blocks`); the split is launched
the ordinary way.

References: vLLM's ``rms_norm_dynamic_per_token_quant`` (the same scales and floors); the
Triton layer-norm tutorial (the row tiling).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kerneltune.kernels import _coop, _coop_pair, _coop_row, _dependent_launch
from kerneltune.kernels._config import QuantConfig
from kerneltune.kernels._coop import gather, lane_chunk, load_rows, publish
from kerneltune.kernels._coop_pair import gather_pair
from kerneltune.kernels._coop_row import gather_row, gather_row_pair, store_row_scalar
from kerneltune.kernels._dependent_launch import release_next_grid, wait_prior_grid
from kerneltune.kernels._launch import Described, Launch, run
from kerneltune.kernels._spec import (
    dependent_launch,
    interpreting,
    launch_options,
    overlaps_row_blocks,
    sm_count,
)
from kerneltune.kernels.rmsnorm_fwd import refuse_unrunnable

#: Version of the launcher's grids, arguments, constexprs and launch options: part of the kernel
#: hash, raised whenever a host-side change alters what the GPU is asked to run.
LAUNCH_VERSION = 1
#: Shared Triton functions this module calls: hashed with it.
DEVICE_CODE_FROM = (_coop, _coop_pair, _coop_row, _dependent_launch)

QUANT_MODES = ("int8", "fp8", "fake")
INT8_MIN_SCALE = float(torch.finfo(torch.float32).eps)
FP8_MAX = 448.0
FP8_MIN_SCALE = 1.0 / (FP8_MAX * 512.0)
#: Per mode: the kernel's MODE, the largest quantised magnitude, the smallest scale (fake
#: clamps max|z| to eps instead).
MODES = {"int8": (0, 127.0, INT8_MIN_SCALE), "fp8": (1, FP8_MAX, FP8_MIN_SCALE),
          "fake": (2, 127.0, 0.0)}


@triton.jit
def _load_part(x_rows, start, SIZE: tl.constexpr, row_ok, N, LAST: tl.constexpr,
               EVICT: tl.constexpr):
    """SIZE columns of the row block from `start`, in fp32, with their columns and mask; only
    the LAST part of a row may reach past N."""
    c = start + tl.arange(0, SIZE)
    mask = row_ok[:, None]
    if LAST:
        mask = mask & (c[None, :] < N)
    return _load_row_chunk(x_rows + c[None, :], mask, EVICT, "evict_first"), c, mask


@triton.jit
def _load_row_chunk(ptrs, mask, EVICT: tl.constexpr, POLICY: tl.constexpr):
    if EVICT:
        v = tl.load(ptrs, mask=mask, other=0.0, eviction_policy=POLICY)
    else:
        v = tl.load(ptrs, mask=mask, other=0.0)
    return v.to(tl.float32)


@triton.jit
def _cast(v, DTYPE: tl.constexpr, SOFT_ROUND: tl.constexpr):
    """fp32 v converted to DTYPE, rounded to nearest, ties to even.

    SOFT_ROUND rounds in fp32 first, with integer arithmetic on the bits, so that the cast is
    exact: the interpreter's fp32 -> bf16 cast truncates and its fp32 -> e4m3 cast drops the
    carry into the exponent (31.5 becomes 16). Compiled kernels use the hardware conversion.
    """
    if SOFT_ROUND:
        if tl.bfloat16 == DTYPE:  # keep 7 of fp32's 23 mantissa bits
            bits = v.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            v = bits.to(tl.float32, bitcast=True)
        if tl.float8e4nv == DTYPE:  # keep 3 mantissa bits; below 2^-6 steps of 2^-9
            bits = v.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000
            v = tl.where(tl.abs(v) < 0.015625, (v + 24576.0) - 24576.0,
                         bits.to(tl.float32, bitcast=True))
    return v.to(DTYPE)


@triton.jit
def _widen(v, SOFT_ROUND: tl.constexpr):
    """v in fp32. Compiled, bf16 is unpacked from the pairs its registers hold with one integer
    op a value: the low one shifted up, the high one with the low half cleared. `.to` moves
    each half into a register of its own first, a PRMT more for the high one.

    Used by the cooperative split, whose row loop issues measurably fewer instructions with it
    and runs faster; whole rows keep `.to`, where it gained nothing and slowed the persistent
    grid."""
    if SOFT_ROUND or v.dtype != tl.bfloat16:
        return v.to(tl.float32)
    return tl.inline_asm_elementwise(
        "shl.b32 $0, $2, 16; and.b32 $1, $2, 0xffff0000;", "=r,=r,r", [v],
        dtype=tl.float32, is_pure=True, pack=2)


@triton.jit
def _rne(v):
    """Round fp32 v half to even; exact for |v| < 2^22 (no libdevice: runs in the interpreter)."""
    return (v + 12582912.0) - 12582912.0


@triton.jit
def _store_q(q_rows, c, q, mask, X_LAYOUT: tl.constexpr, XTYPE: tl.constexpr):
    """Store the chunk q at columns c of its rows; with X_LAYOUT, in x's layout (one 16-byte
    vector of x a thread, 8-byte stores of int8 or fp8) rather than in q's own (16-byte
    stores). Triton lays a chunk out for the widest vector of any access to it, so q's own
    layout has x loaded 32 bytes a thread, in two 16-byte halves that the L2 serves as
    separate requests."""
    ptrs = q_rows + c[None, :]  # the hint needs an op of its own: an argument carries none
    if X_LAYOUT:
        ptrs = tl.max_contiguous(ptrs, [1, 128 // XTYPE.primitive_bitwidth])
    tl.store(ptrs, q, mask=mask)


@triton.jit
def _affine(W, B, c, N, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    """The fp32 weight (or gain) and bias chunks at columns c; 0 where absent (never used)."""
    zero = c.to(tl.float32) * 0.0
    w, b = zero, zero
    if HAS_W:
        w = tl.load(W + c, mask=c < N, other=0.0).to(tl.float32)
    if HAS_B:
        b = tl.load(B + c, mask=c < N, other=0.0).to(tl.float32)
    return w, b


@triton.jit
def _normed(x, r, w, b, MODE: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
            DTYPE: tl.constexpr, SOFT_ROUND: tl.constexpr):
    """The values to quantise for the fp32 chunk x with its weight and bias chunks (`_affine`):
    y (int8, fp8) or z (fake). Masked columns come out 0, so they never raise a row's max."""
    xhat = x * r[:, None]
    if MODE == 2:
        if HAS_W:
            xhat = xhat * w[None, :]
        if HAS_B:
            xhat = xhat + b[None, :]
        return xhat
    y = w[None, :] * _cast(xhat, DTYPE, SOFT_ROUND).to(tl.float32)
    return _cast(y, DTYPE, SOFT_ROUND).to(tl.float32)


@triton.jit
def _row_scale(amax, eps, min_scale, MODE: tl.constexpr, QMAX: tl.constexpr):
    """(the row's stored scale, the factor y is multiplied by before rounding), both (ROWS,)."""
    if MODE == 2:
        scale = tl.math.div_rn(QMAX, tl.maximum(amax, eps))
        return scale, scale
    s = tl.maximum(tl.math.div_rn(amax, QMAX), min_scale)
    return s, tl.math.div_rn(1.0, s)


@triton.jit
def _quantise(y, mul, scale, MODE: tl.constexpr, QMAX: tl.constexpr, QTYPE: tl.constexpr,
              SOFT_ROUND: tl.constexpr):
    """The stored values of the chunk y given its row's factor `mul` and scale (ROWS,).

    int8 and fp8 need no clamp: mul = 1/s with s >= max|y| / QMAX, so |y · mul| <= QMAX
    (1 + 3 · 2^-24), which rounds to at most QMAX (and s = min_scale only when max|y| is
    smaller still)."""
    if MODE == 0:
        # Adding 1.5 · 2^23 rounds v half to even into the sum's low mantissa bits, whose low
        # byte is then the int8 in two's complement: one add where a clamp, the rounding and a
        # float -> int conversion took five instructions. Fused with the multiply on a GPU,
        # it rounds the exact product.
        return (y * mul[:, None] + 12582912.0).to(tl.int32, bitcast=True).to(QTYPE)
    v = y * mul[:, None]
    if MODE == 1:
        return _cast(v, QTYPE, SOFT_ROUND)
    q = tl.minimum(tl.maximum(_rne(v), -128.0), 127.0)
    inv = tl.math.div_rn(1.0, scale)
    return _cast(q * inv[:, None], QTYPE, SOFT_ROUND)


@triton.jit
def _quantise_persistent(X, W, B, Q, SCALE, stride_x, stride_q, M, N, eps, min_scale,
                         BLOCK_N: tl.constexpr, TAIL: tl.constexpr, ROWS: tl.constexpr,
                         EVICT: tl.constexpr, MODE: tl.constexpr, QMAX: tl.constexpr,
                         HAS_W: tl.constexpr, HAS_B: tl.constexpr, SOFT_ROUND: tl.constexpr,
                         PDL: tl.constexpr, X_LAYOUT: tl.constexpr):
    """PERSIST: the whole rows (one block, or BLOCK_N and a TAIL) of row blocks pid, pid + P,
    ... (P programs), each program loading its next row block while it quantises this one, its
    weight in registers for all of them."""
    step = tl.num_programs(0)
    dtype = X.dtype.element_ty
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w, b = _affine(W, B, cols, N, HAS_W, HAS_B)
    x_next = load_rows(X, tl.program_id(0), cols, col_ok, stride_x, M, ROWS, EVICT)
    if TAIL > 0:
        cols_t = BLOCK_N + tl.arange(0, TAIL)
        ok_t = cols_t < N
        w_t, b_t = _affine(W, B, cols_t, N, HAS_W, HAS_B)
        xt_next = load_rows(X, tl.program_id(0), cols_t, ok_t, stride_x, M, ROWS, EVICT)
    blocks = tl.cdiv(M, ROWS)
    for rb in range(tl.program_id(0), blocks, step):
        x = x_next.to(tl.float32)
        x_next = load_rows(X, rb + step, cols, col_ok, stride_x, M, ROWS, EVICT)
        sq = tl.sum(x * x, axis=1)
        if TAIL > 0:
            xt = xt_next.to(tl.float32)
            xt_next = load_rows(X, rb + step, cols_t, ok_t, stride_x, M, ROWS, EVICT)
            sq += tl.sum(xt * xt, axis=1)
        if rb + step >= blocks:  # the last block: nothing left to load
            release_next_grid(PDL)
        rows = rb * ROWS + tl.arange(0, ROWS)
        row_ok = rows < M
        q_rows = Q + rows.to(tl.int64)[:, None] * stride_q
        r = tl.rsqrt(sq / N + eps)
        y = _normed(x, r, w, b, MODE, HAS_W, HAS_B, dtype, SOFT_ROUND)
        amax = tl.max(tl.abs(y), axis=1)
        if TAIL > 0:
            yt = _normed(xt, r, w_t, b_t, MODE, HAS_W, HAS_B, dtype, SOFT_ROUND)
            amax = tl.maximum(amax, tl.max(tl.abs(yt), axis=1))
        scale, mul = _row_scale(amax, eps, min_scale, MODE, QMAX)
        _store_q(q_rows, cols, _quantise(y, mul, scale, MODE, QMAX, Q.dtype.element_ty,
                                         SOFT_ROUND),
                 row_ok[:, None] & col_ok[None, :], X_LAYOUT, dtype)
        if TAIL > 0:
            _store_q(q_rows, cols_t, _quantise(yt, mul, scale, MODE, QMAX, Q.dtype.element_ty,
                                               SOFT_ROUND),
                     row_ok[:, None] & ok_t[None, :], X_LAYOUT, dtype)
        tl.store(SCALE + rows, scale, mask=row_ok)


@triton.jit
def _rmsnorm_quant_kernel(
    X, W, B, Q, SCALE,
    stride_x, stride_q, M, N, eps, min_scale,
    BLOCK_N: tl.constexpr, TAIL: tl.constexpr, ROWS: tl.constexpr, SINGLE: tl.constexpr,
    EVICT: tl.constexpr, MODE: tl.constexpr, QMAX: tl.constexpr, HAS_W: tl.constexpr,
    HAS_B: tl.constexpr, SOFT_ROUND: tl.constexpr, PERSIST: tl.constexpr,
    X_LAYOUT: tl.constexpr, PDL: tl.constexpr,
):
    dtype = X.dtype.element_ty
    qtype = Q.dtype.element_ty
    wait_prior_grid(PDL)
    if PERSIST:
        _quantise_persistent(X, W, B, Q, SCALE, stride_x, stride_q, M, N, eps, min_scale,
                             BLOCK_N, TAIL, ROWS, EVICT, MODE, QMAX, HAS_W, HAS_B, SOFT_ROUND,
                             PDL, X_LAYOUT)
    else:
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        row_ok = rows < M
        rows = rows.to(tl.int64)
        x_rows = X + rows[:, None] * stride_x
        q_rows = Q + rows[:, None] * stride_q
        if SINGLE:
            # With a TAIL, the first block lies within the row: only the row mask applies to it.
            x, c, mask = _load_part(x_rows, 0, BLOCK_N, row_ok, N, TAIL == 0, EVICT)
            sq = tl.sum(x * x, axis=1)
            if TAIL > 0:
                xt, ct, mask_t = _load_part(x_rows, BLOCK_N, TAIL, row_ok, N, True, EVICT)
                sq += tl.sum(xt * xt, axis=1)
            r = tl.rsqrt(sq / N + eps)
            w, b = _affine(W, B, c, N, HAS_W, HAS_B)
            y = _normed(x, r, w, b, MODE, HAS_W, HAS_B, dtype, SOFT_ROUND)
            amax = tl.max(tl.abs(y), axis=1)
            if TAIL > 0:
                wt, bt = _affine(W, B, ct, N, HAS_W, HAS_B)
                yt = _normed(xt, r, wt, bt, MODE, HAS_W, HAS_B, dtype, SOFT_ROUND)
                amax = tl.maximum(amax, tl.max(tl.abs(yt), axis=1))
            release_next_grid(PDL)
            scale, mul = _row_scale(amax, eps, min_scale, MODE, QMAX)
            _store_q(q_rows, c, _quantise(y, mul, scale, MODE, QMAX, qtype, SOFT_ROUND), mask,
                     X_LAYOUT, dtype)
            if TAIL > 0:
                _store_q(q_rows, ct, _quantise(yt, mul, scale, MODE, QMAX, qtype, SOFT_ROUND),
                         mask_t, X_LAYOUT, dtype)
        else:
            cols = tl.arange(0, BLOCK_N)
            acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
            for start in range(0, N, BLOCK_N):
                c = start + cols
                mask = row_ok[:, None] & (c[None, :] < N)
                x = _load_row_chunk(x_rows + c[None, :], mask, EVICT, "evict_last")
                acc += x * x
            r = tl.rsqrt(tl.sum(acc, axis=1) / N + eps)
            amax = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
            for start in range(0, N, BLOCK_N):
                c = start + cols
                mask = row_ok[:, None] & (c[None, :] < N)
                x = _load_row_chunk(x_rows + c[None, :], mask, EVICT, "evict_last")
                w, b = _affine(W, B, c, N, HAS_W, HAS_B)
                y = _normed(x, r, w, b, MODE, HAS_W, HAS_B, dtype, SOFT_ROUND)
                amax = tl.maximum(amax, tl.abs(y))
            scale, mul = _row_scale(tl.max(amax, axis=1), eps, min_scale, MODE, QMAX)
            for start in range(0, N, BLOCK_N):
                c = start + cols
                mask = row_ok[:, None] & (c[None, :] < N)
                x = _load_row_chunk(x_rows + c[None, :], mask, EVICT, "evict_first")
                w, b = _affine(W, B, c, N, HAS_W, HAS_B)
                y = _normed(x, r, w, b, MODE, HAS_W, HAS_B, dtype, SOFT_ROUND)
                q = _quantise(y, mul, scale, MODE, QMAX, qtype, SOFT_ROUND)
                _store_q(q_rows, c, q, mask, X_LAYOUT, dtype)
            release_next_grid(PDL)
        tl.store(SCALE + rows, scale, mask=row_ok)


@triton.jit
def _store_quantised(Q, SCALE, y, max_parts, rb, q, cols, col_ok, stride_q, M, eps, min_scale,
                     ROWS: tl.constexpr, MODE: tl.constexpr, QMAX: tl.constexpr,
                     SOFT_ROUND: tl.constexpr):
    """Row block `rb`'s chunk y quantised with the scale of its chunks' maxima `max_parts`
    (gathered), and stored, with the scale (by chunk 0). A block before the first (rb < 0)
    stores nothing."""
    rows = rb * ROWS + tl.arange(0, ROWS)
    row_ok = (rows >= 0) & (rows < M)
    scale, mul = _row_scale(tl.max(max_parts, axis=1), eps, min_scale, MODE, QMAX)
    qv = _quantise(_widen(y, SOFT_ROUND), mul, scale, MODE, QMAX, Q.dtype.element_ty,
                   SOFT_ROUND)
    tl.store(Q + rows.to(tl.int64)[:, None] * stride_q + cols[None, :], qv,
             mask=row_ok[:, None] & col_ok[None, :])
    # (A vector predicate: the interpreter rejects a scalar one in a mask.)
    tl.store(SCALE + rows, scale, mask=row_ok & ((rows * 0 + q) == 0))


@triton.jit
def _quantise_split_blocks(PART_SQ, PART_MAX, NQ, X, Q, SCALE, stride_x, stride_q, M, N, eps,
                           min_scale, x, w, b, lane, n_lanes, q, cols, col_ok,
                           ROWS: tl.constexpr, NQ_POW2: tl.constexpr, PHASE: tl.constexpr,
                           EVICT: tl.constexpr, MODE: tl.constexpr, QMAX: tl.constexpr,
                           HAS_W: tl.constexpr, HAS_B: tl.constexpr, SOFT_ROUND: tl.constexpr):
    """The split's row loop over blocks of several rows (x: the lane's first block, its sums of
    squares published), the block after next loaded a step ahead into registers."""
    BLOCK_N: tl.constexpr = x.shape[1]
    dtype = X.dtype.element_ty
    x_next = load_rows(X, lane + n_lanes, cols, col_ok, stride_x, M, ROWS, EVICT)
    if MODE == 2:
        y_prev = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    else:
        y_prev = tl.zeros([ROWS, BLOCK_N], dtype=dtype)
    for rb in range(lane, tl.cdiv(M, ROWS), n_lanes):
        x_ahead = x_next
        x_next = load_rows(X, rb + 2 * n_lanes, cols, col_ok, stride_x, M, ROWS, EVICT)
        if PHASE <= 1:
            xf = _widen(x_ahead, SOFT_ROUND)
            publish(PART_SQ, rb + n_lanes, q, NQ, M, tl.sum(xf * xf, axis=1), ROWS)
        if PHASE != 1:
            rows = rb * ROWS + tl.arange(0, ROWS)
            row_ok = rows < M
            if PHASE == 2:  # the maxima of the block before are not all published yet
                sq_parts = gather(PART_SQ, rows, row_ok, NQ, NQ_POW2, False)
            else:
                prev = rows - n_lanes * ROWS
                sq_parts, max_prev = gather_pair(PART_SQ, rows, row_ok, PART_MAX, prev,
                                                 prev >= 0, NQ, NQ_POW2, PHASE == 0)
            r = tl.rsqrt(tl.sum(sq_parts, axis=1) / N + eps)
            y = _normed(_widen(x, SOFT_ROUND), r, w, b, MODE, HAS_W, HAS_B, dtype, SOFT_ROUND)
            if PHASE <= 2:
                publish(PART_MAX, rb, q, NQ, M, tl.max(tl.abs(y), axis=1), ROWS)
            if PHASE != 2:
                _store_quantised(Q, SCALE, y_prev, max_prev, rb - n_lanes, q, cols, col_ok,
                                 stride_q, M, eps, min_scale, ROWS, MODE, QMAX, SOFT_ROUND)
            y_prev = y.to(y_prev.dtype)
        x = x_ahead
    if PHASE == 0 or PHASE == 3:
        last = lane + (tl.cdiv(M, ROWS) - 1 - lane) // n_lanes * n_lanes
        rows = last * ROWS + tl.arange(0, ROWS)
        max_last = gather(PART_MAX, rows, (rows >= 0) & (rows < M), NQ, NQ_POW2, PHASE == 0)
        _store_quantised(Q, SCALE, y_prev, max_last, last, q, cols, col_ok, stride_q, M, eps,
                         min_scale, ROWS, MODE, QMAX, SOFT_ROUND)


@triton.jit
def _store_row_quantised(Q, SCALE, y, amax, row, q, cols, col_ok, stride_q, M, eps, min_scale,
                         NQ_POW2: tl.constexpr, MODE: tl.constexpr, QMAX: tl.constexpr,
                         SOFT_ROUND: tl.constexpr):
    """`_store_quantised` of one row (y: 1 x BLOCK_N) whose max|y| is a scalar."""
    scale, mul = _row_scale(amax, eps, min_scale, MODE, QMAX)
    one = tl.zeros([1], dtype=tl.float32)
    qv = _quantise(_widen(y, SOFT_ROUND), mul + one, scale + one, MODE, QMAX,
                   Q.dtype.element_ty, SOFT_ROUND)
    rows = row + tl.arange(0, 1)
    ok = col_ok[None, :] & (rows >= 0)[:, None] & (rows < M)[:, None]
    tl.store(Q + rows.to(tl.int64)[:, None] * stride_q + cols[None, :], qv, mask=ok)
    store_row_scalar(SCALE, row, scale, q, M, NQ_POW2)


@triton.jit
def _quantise_split_rows(PART_SQ, PART_MAX, NQ, X, Q, SCALE, stride_x, stride_q, M, N, eps,
                         min_scale, x, w, b, lane, n_lanes, q, cols, col_ok,
                         NQ_POW2: tl.constexpr, PHASE: tl.constexpr, EVICT: tl.constexpr,
                         MODE: tl.constexpr, QMAX: tl.constexpr, HAS_W: tl.constexpr,
                         HAS_B: tl.constexpr, SOFT_ROUND: tl.constexpr, STAGES: tl.constexpr):
    """The split's row loop with one row a block (x: the lane's first row, its sum of squares
    published): each step loads the next row and publishes its sum of squares, gathers this
    row's sums with the row before's maxima in one wait (`kerneltune.kernels._coop_row`),
    quantises and stores the row before, then publishes this row's max. The load is Triton's to
    schedule: with STAGES > 1 it is issued STAGES - 1 steps early, into shared memory.

    The row before is stored first, not after this row's max as the several-row loop does, so
    that a thread holds the y of one row at a time, not this row's beside the row before's:
    64 elements a thread then fit the 168 registers of six 2-warp programs an SM without
    spilling. Those hold 24K elements an SM, so a lane takes fewer steps than at 16K; the
    order measured faster at long rows than the one before it, with bit-identical output."""
    BLOCK_N: tl.constexpr = x.shape[1]
    dtype = X.dtype.element_ty
    if MODE == 2:
        y_prev = tl.zeros([1, BLOCK_N], dtype=tl.float32)
    else:
        y_prev = tl.zeros([1, BLOCK_N], dtype=dtype)
    for row in tl.range(lane, M, n_lanes, num_stages=STAGES):
        x_ahead = load_rows(X, row + n_lanes, cols, col_ok, stride_x, M, 1, EVICT)
        if PHASE <= 1:
            xf = _widen(x_ahead, SOFT_ROUND)
            publish(PART_SQ, row + n_lanes, q, NQ, M, tl.sum(xf * xf, axis=1), 1)
        if PHASE != 1:
            prev = row - n_lanes
            if PHASE == 2:  # the maxima of the row before are not all published yet
                sq_parts = gather_row(PART_SQ, row, NQ, NQ_POW2, False)
                max_prev = sq_parts
            else:
                sq_parts, max_prev = gather_row_pair(PART_SQ, row, PART_MAX, prev, NQ, NQ_POW2,
                                                     PHASE == 0)
            if PHASE != 2:  # the row before goes first: its y is gone before this row's is made
                _store_row_quantised(Q, SCALE, y_prev, tl.max(max_prev), prev, q, cols, col_ok,
                                     stride_q, M, eps, min_scale, NQ_POW2, MODE, QMAX,
                                     SOFT_ROUND)
            r = tl.rsqrt(tl.sum(sq_parts) / N + eps) + tl.zeros([1], dtype=tl.float32)
            y = _normed(_widen(x, SOFT_ROUND), r, w, b, MODE, HAS_W, HAS_B, dtype, SOFT_ROUND)
            if PHASE <= 2:
                publish(PART_MAX, row, q, NQ, M, tl.max(tl.abs(y), axis=1), 1)
            y_prev = y.to(y_prev.dtype)
        x = x_ahead
    if PHASE == 0 or PHASE == 3:
        last = lane + (M - 1 - lane) // n_lanes * n_lanes
        max_last = gather_row(PART_MAX, last, NQ, NQ_POW2, PHASE == 0)
        _store_row_quantised(Q, SCALE, y_prev, tl.max(max_last), last, q, cols, col_ok,
                             stride_q, M, eps, min_scale, NQ_POW2, MODE, QMAX, SOFT_ROUND)


@triton.jit
def _rmsnorm_quant_coop_kernel(
    PART_SQ, PART_MAX, NQ, X, W, B, Q, SCALE, stride_x, stride_q, M, N, eps, min_scale,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, NQ_POW2: tl.constexpr, PHASE: tl.constexpr,
    EVICT: tl.constexpr, MODE: tl.constexpr, QMAX: tl.constexpr, HAS_W: tl.constexpr,
    HAS_B: tl.constexpr, SOFT_ROUND: tl.constexpr, STAGES: tl.constexpr,
):
    """COOP (see `kerneltune.kernels._coop`) over NQ chunks: a row's chunks agree twice, on the
    sum of squares (PART_SQ[row, q]) and then on max|y| (PART_MAX[row, q]). PHASE 0 does
    everything in one launch; PHASE 1, 2 and 3 are its steps apart: the partial sums, the
    partial maxima, the stores.

    Pipelined so that no agreement is waited for right after it is published: in the step of
    row block rb, a program publishes the sums of squares of the next block, gathers those of
    rb with the maxima of the block before rb (both published a step ago, in one wait), then
    publishes the maxima of rb and quantises and stores the block before. Unpipelined
    (gathering rb's maxima at once), the split spent much of its time waiting on its peers.
    The blocks stay as stored until used; y waits a step in x's dtype, in which it is exact
    (fake's z in fp32). One row a block takes `_quantise_split_rows`, whose rows are loaded
    ahead by Triton's pipeliner; several take `_quantise_split_blocks`."""
    lane, n_lanes, q, cols, col_ok = lane_chunk(NQ, N, BLOCK_N)
    w, b = _affine(W, B, cols, N, HAS_W, HAS_B)
    x = load_rows(X, lane, cols, col_ok, stride_x, M, ROWS, EVICT)
    if PHASE <= 1:
        xf = _widen(x, SOFT_ROUND)
        publish(PART_SQ, lane, q, NQ, M, tl.sum(xf * xf, axis=1), ROWS)
    if ROWS == 1:
        _quantise_split_rows(PART_SQ, PART_MAX, NQ, X, Q, SCALE, stride_x, stride_q, M, N, eps,
                             min_scale, x, w, b, lane, n_lanes, q, cols, col_ok, NQ_POW2, PHASE,
                             EVICT, MODE, QMAX, HAS_W, HAS_B, SOFT_ROUND, STAGES)
    else:
        _quantise_split_blocks(PART_SQ, PART_MAX, NQ, X, Q, SCALE, stride_x, stride_q, M, N, eps,
                               min_scale, x, w, b, lane, n_lanes, q, cols, col_ok, ROWS,
                               NQ_POW2, PHASE, EVICT, MODE, QMAX, HAS_W, HAS_B, SOFT_ROUND)


def row_parts(n: int) -> tuple[int, int]:
    """A row of n elements as two power-of-two blocks: the largest that fits in the row, and
    the rest rounded up (5120: 4096 + 1024; 7168: 4096 + 4096); (n, 0) for a power of two."""
    head = 1 << (n.bit_length() - 1)
    rest = n - head
    return head, 0 if rest == 0 else 1 << (rest - 1).bit_length()


def quant_dtype(quant: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype of q: int8, float8_e4m3fn, or the input dtype for fake-quant."""
    if quant == "int8":
        return torch.int8
    if quant == "fp8":
        fp8 = getattr(torch, "float8_e4m3fn", None)
        if fp8 is None:
            raise TypeError(f"quant='fp8' needs torch.float8_e4m3fn, absent in torch "
                            f"{torch.__version__}")
        return fp8
    if quant == "fake":
        return dtype
    raise ValueError(f"quant must be one of {QUANT_MODES}, got {quant!r}")


def describe_rmsnorm_quant_fwd(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
    quant: str, config: QuantConfig, pdl: bool | None = None,
) -> Described:
    """Quant on a (M, N) view with unit stride along N (rows may be strided).

    `weight` is the RMSNorm weight for int8/fp8 (required) and the optional gain for fake;
    `bias` is only for fake. Returns q (M, N) (int8, float8_e4m3fn, or x's dtype for fake) and
    the per-row scale (M,) fp32: the dequantisation step s for int8/fp8, the quantisation
    factor 127 / max|z| for fake. `pdl`: launch as a programmatic dependent launch (None:
    wherever the device has it; a persistent grid over more row blocks than programs never is).
    ValueError for a config no launch can run right
    (`kerneltune.kernels.rmsnorm_fwd.refuse_unrunnable`; a whole row in two parts is covered).
    """
    refuse_unrunnable(config, x.shape[-1],
                      config.SINGLE and not config.COOP and config.PARTS != 2)
    qtype = quant_dtype(quant, x.dtype)
    if quant != "fake":
        if weight is None:
            raise ValueError(f"quant={quant!r} needs the RMSNorm weight")
        if bias is not None:
            raise ValueError(f"bias is only supported with quant='fake', not {quant!r}")
    m, n = x.shape
    q = torch.empty((m, n), dtype=qtype, device=x.device)
    scale = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m == 0:
        return Described((q, scale), ())
    mode, qmax, min_scale = MODES[quant]
    # An absent gain or bias is never read: any pointer will do.
    w_ptr, b_ptr = x if weight is None else weight, x if bias is None else bias
    flags = {"EVICT": config.EVICT, "MODE": mode, "QMAX": qmax, "HAS_W": weight is not None,
             "HAS_B": bias is not None, "SOFT_ROUND": interpreting()}
    args = (x, w_ptr, b_ptr, q, scale, x.stride(0), q.stride(0), m, n, eps, min_scale)
    if config.COOP:
        parts, launches = _coop.launches(
            _rmsnorm_quant_coop_kernel, x, config, 2, *args, STAGES=config.num_stages, **flags)
        return Described((q, scale), launches, (parts,))
    rows = config.ROWS
    block, tail = config.BLOCK_N, 0
    if config.SINGLE and config.PARTS == 2:
        block, tail = row_parts(n)
    per_sm = config.GRID_MULT
    grid = triton.cdiv(m, rows)
    if per_sm > 1:
        if not config.SINGLE:
            raise ValueError(f"a persistent grid (GRID_MULT={per_sm}) runs whole rows, not "
                             f"{config}")
        grid = min(grid, per_sm * sm_count(x.device))
    pdl = overlaps_row_blocks(dependent_launch(x.device) if pdl is None else pdl, grid,
                              triton.cdiv(m, rows))
    return Described((q, scale), (Launch(
        _rmsnorm_quant_kernel, (grid,), args,
        {"BLOCK_N": block, "TAIL": tail, "ROWS": rows, "SINGLE": config.SINGLE,
         "PERSIST": per_sm > 1, "PDL": pdl, "launch_pdl": pdl, "X_LAYOUT": config.X_LAYOUT,
         **flags, **launch_options(config), **_coop.resident_options(config)}),))


def rmsnorm_quant_fwd(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
    quant: str, config: QuantConfig, pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `describe_rmsnorm_quant_fwd`: q and the per-row scale."""
    return run(describe_rmsnorm_quant_fwd(x, weight, bias, eps, quant, config, pdl))
