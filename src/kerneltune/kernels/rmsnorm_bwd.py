"""RMSNorm backward: dx and dw from dy, the forward's input x and its saved rstd.

Maths (the gradient of `kerneltune.kernels.rmsnorm_fwd`), everything in fp32::

    x̂  = x · r                       r = rstd saved by the forward (fp32, one per row)
    g   = dy · (w + offset)
    dx  = r · (g − x̂ · mean(g · x̂))  mean over N; one cast to x.dtype
    dw  = Σ_rows dy · x̂ᵥ              accumulated in fp32, one cast to weight.dtype

where x̂ᵥ is the value the forward multiplied w by: in llama mode (offset = 0) x̂ rounded to
x.dtype, ``(x · r).to(x.dtype)`` with the product in fp32; in gemma mode (offset ≠ 0) x̂ itself
in fp32. The rounding is treated as the identity for dx (straight-through), as autograd does
through a cast.

Design: a persistent grid of GRID = min(GRID_MULT · SMs, ⌈M / ROWS⌉) programs; program p takes
row blocks p, p + GRID, … and keeps its share of dw as an fp32 partial. DW says where:

- "registers" (SINGLE): the row block in registers, one read of x and dy; the partial beside
  it, stored once at the end. PREFETCH issues the next block's loads before this one's maths
  (two blocks in flight a program, the next held as stored).
- "global": the partial in the program's private row of an fp32 buffer, freeing registers for
  larger blocks; also the looped case (BLOCK_N < N), two passes over the chunks, mean(g · x̂)
  then dx and dw, the re-read served by L2 (EVICT). Plain load-add-store: no other program
  touches the row, and the first row block stores, so the buffer needs no zeroing; the
  traffic stays in L2 while GRID rows of partials, x and dy fit there.
- "columns", for rows too long for that: one kernel takes each row's mean(g · x̂), then a
  (GRID, ⌈N / BLOCK_N⌉) grid gives each program a column chunk, its partial in registers.
  x and dy are read twice (10 bytes a bf16 element against 6), but nothing else, whatever N.
- "split": the row over ⌈N / BLOCK_N⌉ cooperating programs (`kerneltune.kernels._coop`), so
  x and dy are read once and stay in registers. The chunks agree once, on Σ g·x, summed in a
  fixed order (dx is deterministic); the next block's dots go out before this one's are read.

A second kernel sums the (GRID, N) partials and casts to weight.dtype (`reduce_launch`). No
M × N fp32 buffer is made: the extra traffic, GRID · N · 4 bytes written and read once, is
what GRID_MULT trades against latency hiding. A grid of one program with "registers" or
"split" writes dw itself, in one launch. On sm_90 and later every launch is a programmatic
dependent launch (`kerneltune.kernels._dependent_launch`): the reduction is placed while the
main kernel finishes, the split while the fill of its slots runs (`_coop_dependent`).

References: the Triton layer-norm tutorial (dw partials summed by a second kernel); Liger's
``rms_norm`` backward (one fp32 partial per program of an SM-sized grid).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kerneltune.kernels import _coop, _coop_dependent, _dependent_launch
from kerneltune.kernels._config import BackwardConfig
from kerneltune.kernels._coop import gather, lane_chunk, load_rows, publish
from kerneltune.kernels._dependent_launch import release_next_grid, wait_prior_grid
from kerneltune.kernels._launch import Described, Launch, run
from kerneltune.kernels._spec import (
    dependent_launch,
    launch_options,
    next_pow2,
    sm_count,
)
from kerneltune.kernels.rmsnorm_fwd import refuse_unrunnable

#: Version of the launcher's grids, arguments, constexprs and launch options: part of the kernel
#: hash, raised whenever a host-side change alters what the GPU is asked to run.
LAUNCH_VERSION = 1
#: Shared Triton functions this module calls: hashed with it.
DEVICE_CODE_FROM = (_coop, _coop_dependent, _dependent_launch)

#: Where dw's partial sums live (see above); a config naming another is refused.
DW_MODES = ("registers", "global", "columns", "split")
#: Partial rows the reduction kernel adds per step, at most; fewer partials make a tile of
#: their own count, rounded up to a power of two (see `reduce_launch`).
REDUCE_MAX_ROWS = 512
#: fp32 values one reduction program loads per step: at most (16 per thread at 8 warps), and
#: at least (one warp's 16 each) at REDUCE_MIN_ROWS partial rows or more, so that a few
#: partials still give each program 32 columns or more.
REDUCE_TILE = 4096
REDUCE_MIN_TILE = 512
REDUCE_MIN_ROWS = 16
#: The fp32 value next to `_coop.UNSET` (-1) toward zero, published for a dot of exactly -1.
NEXT_TO_UNSET = tl.constexpr(-(1.0 - 2.0**-24))


@triton.jit
def _dw_terms(dy, xhat, X, GEMMA: tl.constexpr):
    """dy · x̂ᵥ summed over the block's rows, x̂ᵥ being what the forward multiplied w by.

    Llama mode rounds x̂ to x's dtype to nearest, ties to even; bf16 on the bits, since the
    Triton interpreter's fp32 -> bf16 cast truncates (this is exactly the GPU's cvt.rn for
    finite values, at the cost of three integer ops).
    """
    if GEMMA:
        xhat_v = xhat
    elif tl.bfloat16 == X.dtype.element_ty:
        bits = xhat.to(tl.uint32, bitcast=True)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        xhat_v = bits.to(tl.float32, bitcast=True)
    else:
        xhat_v = xhat.to(X.dtype.element_ty).to(tl.float32)
    return tl.sum(dy * xhat_v, axis=0)


@triton.jit
def _store_dw(part_row, DW, cols, acc, col_ok, DIRECT: tl.constexpr):
    """The program's fp32 dw partial of columns `cols` into its partial row; with DIRECT (the
    grid's only program for these columns) dw itself, cast once."""
    if DIRECT:
        tl.store(DW + cols, acc.to(DW.dtype.element_ty), mask=col_ok)
    else:
        tl.store(part_row + cols, acc, mask=col_ok)


@triton.jit
def _load_block(DY, X, RSTD, rb, cols, col_ok, stride_dy, stride_x, M,
                ROWS: tl.constexpr, READ_ONCE: tl.constexpr):
    """Row block `rb` of dy and x as stored (converted where used) and its rstd; rows past M
    load nothing."""
    rows = rb * ROWS + tl.arange(0, ROWS)
    row_ok = rows < M
    r = tl.load(RSTD + rows, mask=row_ok, other=0.0)
    rows = rows.to(tl.int64)
    mask = row_ok[:, None] & col_ok[None, :]
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                eviction_policy=READ_ONCE)
    dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0,
                 eviction_policy=READ_ONCE)
    return dy, x, r


@triton.jit
def _rmsnorm_bwd_kernel(
    DY, X, W, RSTD, DX, DW_PART, DW,
    stride_dy, stride_x, stride_dx, M, N, offset,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, SINGLE: tl.constexpr, PREFETCH: tl.constexpr,
    DW_REGS: tl.constexpr, DIRECT: tl.constexpr, GEMMA: tl.constexpr,
    READ_ONCE: tl.constexpr, READ_TWICE: tl.constexpr, PDL: tl.constexpr,
):
    wait_prior_grid(PDL)
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    n_blocks = tl.cdiv(M, ROWS)
    cols = tl.arange(0, BLOCK_N)
    part_row = DW_PART + pid.to(tl.int64) * N
    if SINGLE:
        col_ok = cols < N
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32) + offset
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        if PREFETCH:
            dy_next, x_next, r_next = _load_block(DY, X, RSTD, pid, cols, col_ok, stride_dy,
                                                  stride_x, M, ROWS, READ_ONCE)
        for rb in range(pid, n_blocks, n_prog):
            if PREFETCH:
                # The next block's loads are issued before this block's arithmetic, so each
                # program keeps two blocks in flight.
                dy_raw, x_raw, r = dy_next, x_next, r_next
                dy_next, x_next, r_next = _load_block(DY, X, RSTD, rb + n_prog, cols, col_ok,
                                                      stride_dy, stride_x, M, ROWS, READ_ONCE)
            else:
                dy_raw, x_raw, r = _load_block(DY, X, RSTD, rb, cols, col_ok, stride_dy,
                                               stride_x, M, ROWS, READ_ONCE)
            x, dy = x_raw.to(tl.float32), dy_raw.to(tl.float32)
            rows = rb * ROWS + tl.arange(0, ROWS)
            mask = (rows < M)[:, None] & col_ok[None, :]
            rows = rows.to(tl.int64)
            xhat = x * r[:, None]
            g = dy * w[None, :]
            c = tl.sum(g * xhat, axis=1) / N
            dx = r[:, None] * (g - xhat * c[:, None])
            tl.store(DX + rows[:, None] * stride_dx + cols[None, :],
                     dx.to(DX.dtype.element_ty), mask=mask)
            if DW_REGS:
                acc += _dw_terms(dy, xhat, X, GEMMA)
            else:
                # The program's first block stores; later ones add to what it stored. (The
                # predicate is a vector: the interpreter rejects a scalar one in a mask.)
                later = (cols * 0 + rb) != pid
                prev = tl.load(part_row + cols, mask=col_ok & later, other=0.0)
                tl.store(part_row + cols, prev + _dw_terms(dy, xhat, X, GEMMA),
                         mask=col_ok)
        release_next_grid(PDL)
        if DW_REGS:
            _store_dw(part_row, DW, cols, acc, col_ok, DIRECT)
    else:
        for rb in range(pid, n_blocks, n_prog):
            rows = rb * ROWS + tl.arange(0, ROWS)
            row_ok = rows < M
            r = tl.load(RSTD + rows, mask=row_ok, other=0.0)
            rows = rows.to(tl.int64)
            x_rows = X + rows[:, None] * stride_x
            dy_rows = DY + rows[:, None] * stride_dy
            dx_rows = DX + rows[:, None] * stride_dx
            # Pass 1: mean(g · x̂) = r · Σ(g · x) / N.
            gx = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
            for start in range(0, N, BLOCK_N):
                c_idx = start + cols
                c_ok = c_idx < N
                mask = row_ok[:, None] & c_ok[None, :]
                x = tl.load(x_rows + c_idx[None, :], mask=mask, other=0.0,
                            eviction_policy=READ_TWICE).to(tl.float32)
                dy = tl.load(dy_rows + c_idx[None, :], mask=mask, other=0.0,
                             eviction_policy=READ_TWICE).to(tl.float32)
                w = tl.load(W + c_idx, mask=c_ok, other=0.0).to(tl.float32) + offset
                gx += dy * w[None, :] * x
            c = tl.sum(gx, axis=1) * r / N
            # Pass 2: dx, and dw into the program's private partial row.
            for start in range(0, N, BLOCK_N):
                c_idx = start + cols
                c_ok = c_idx < N
                mask = row_ok[:, None] & c_ok[None, :]
                x = tl.load(x_rows + c_idx[None, :], mask=mask, other=0.0,
                            eviction_policy=READ_ONCE).to(tl.float32)
                dy = tl.load(dy_rows + c_idx[None, :], mask=mask, other=0.0,
                             eviction_policy=READ_ONCE).to(tl.float32)
                w = tl.load(W + c_idx, mask=c_ok, other=0.0).to(tl.float32) + offset
                xhat = x * r[:, None]
                g = dy * w[None, :]
                dx = r[:, None] * (g - xhat * c[:, None])
                tl.store(dx_rows + c_idx[None, :], dx.to(DX.dtype.element_ty), mask=mask)
                prev = tl.load(part_row + c_idx, mask=c_ok & ((cols * 0 + rb) != pid), other=0.0)
                tl.store(part_row + c_idx, prev + _dw_terms(dy, xhat, X, GEMMA),
                         mask=c_ok)
        release_next_grid(PDL)


@triton.jit
def _row_dot_kernel(
    DY, X, W, RSTD, C, stride_dy, stride_x, M, N, offset,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, READ_TWICE: tl.constexpr, PDL: tl.constexpr,
):
    """C[row] = mean(g · x̂) = r · Σ_N(dy · (w + offset) · x) / N for ROWS rows per program."""
    wait_prior_grid(PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < M
    r = tl.load(RSTD + rows, mask=row_ok, other=0.0)
    rows64 = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    gx = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        c_idx = start + cols
        c_ok = c_idx < N
        mask = row_ok[:, None] & c_ok[None, :]
        x = tl.load(X + rows64[:, None] * stride_x + c_idx[None, :], mask=mask, other=0.0,
                    eviction_policy=READ_TWICE).to(tl.float32)
        dy = tl.load(DY + rows64[:, None] * stride_dy + c_idx[None, :], mask=mask, other=0.0,
                     eviction_policy=READ_TWICE).to(tl.float32)
        w = tl.load(W + c_idx, mask=c_ok, other=0.0).to(tl.float32) + offset
        gx += dy * w[None, :] * x
    release_next_grid(PDL)
    tl.store(C + rows, tl.sum(gx, axis=1) * r / N, mask=row_ok)


@triton.jit
def _dx_dw_columns_kernel(
    DY, X, W, RSTD, C, DX, DW_PART,
    stride_dy, stride_x, stride_dx, M, N, offset,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, GEMMA: tl.constexpr, READ_ONCE: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program (p, q) owns columns q·BLOCK_N … and row blocks p, p + grid(0), …: dx from the
    rows' C, and the dw partial of its columns in registers, stored once into row p."""
    wait_prior_grid(PDL)
    pid = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32) + offset
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for rb in range(pid, tl.cdiv(M, ROWS), tl.num_programs(0)):
        rows = rb * ROWS + tl.arange(0, ROWS)
        row_ok = rows < M
        r = tl.load(RSTD + rows, mask=row_ok, other=0.0)
        c = tl.load(C + rows, mask=row_ok, other=0.0)
        rows = rows.to(tl.int64)
        mask = row_ok[:, None] & col_ok[None, :]
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                    eviction_policy=READ_ONCE).to(tl.float32)
        dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0,
                     eviction_policy=READ_ONCE).to(tl.float32)
        xhat = x * r[:, None]
        dx = r[:, None] * (dy * w[None, :] - xhat * c[:, None])
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty),
                 mask=mask)
        acc += _dw_terms(dy, xhat, X, GEMMA)
    release_next_grid(PDL)
    tl.store(DW_PART + pid.to(tl.int64) * N + cols, acc, mask=col_ok)


@triton.jit
def _chunk_dots(dy, x, w):
    """Σ g·x of each row over the chunk, as published: never `UNSET` (-1), which a gather
    takes for a slot not written yet, so a dot of exactly -1 goes out one ulp nearer zero."""
    dots = tl.sum(dy.to(tl.float32) * w[None, :] * x.to(tl.float32), axis=1)
    return tl.where(dots == _coop.UNSET, NEXT_TO_UNSET, dots)


@triton.jit
def _rmsnorm_bwd_split_kernel(
    DOTS, NQ, DY, X, W, RSTD, DX, DW_PART, DW,
    stride_dy, stride_x, stride_dx, M, N, offset,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, NQ_POW2: tl.constexpr, PHASE: tl.constexpr,
    DIRECT: tl.constexpr, GEMMA: tl.constexpr, EVICT: tl.constexpr, PDL: tl.constexpr,
):
    """DW = "split" (see `kerneltune.kernels._coop`) over NQ chunks: a row's chunks agree once,
    on Σ g·x (DOTS[row, q]). PHASE 0 does it all in one launch; PHASE 1 and 2 are its steps
    apart: the dots, then dx and dw.

    Pipelined one row block deep, as the forward is: a program publishes the next block's dots
    before it gathers this block's. The blocks stay as stored until used (three of x and dy
    are live: this one, the next, whose dots are out, and the one after it, loading)."""
    wait_prior_grid(PDL)
    lane, n_lanes, q, cols, col_ok = lane_chunk(NQ, N, BLOCK_N)
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32) + offset
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    dy = load_rows(DY, lane, cols, col_ok, stride_dy, M, ROWS, EVICT)
    x = load_rows(X, lane, cols, col_ok, stride_x, M, ROWS, EVICT)
    if PHASE <= 1:
        publish(DOTS, lane, q, NQ, M, _chunk_dots(dy, x, w), ROWS)
    dy_next = load_rows(DY, lane + n_lanes, cols, col_ok, stride_dy, M, ROWS, EVICT)
    x_next = load_rows(X, lane + n_lanes, cols, col_ok, stride_x, M, ROWS, EVICT)
    for rb in range(lane, tl.cdiv(M, ROWS), n_lanes):
        dy_ahead, x_ahead = dy_next, x_next
        dy_next = load_rows(DY, rb + 2 * n_lanes, cols, col_ok, stride_dy, M, ROWS, EVICT)
        x_next = load_rows(X, rb + 2 * n_lanes, cols, col_ok, stride_x, M, ROWS, EVICT)
        if PHASE <= 1:
            publish(DOTS, rb + n_lanes, q, NQ, M, _chunk_dots(dy_ahead, x_ahead, w), ROWS)
        if PHASE != 1:
            rows = rb * ROWS + tl.arange(0, ROWS)
            row_ok = rows < M
            r = tl.load(RSTD + rows, mask=row_ok, other=0.0)
            dots = gather(DOTS, rows, row_ok, NQ, NQ_POW2, PHASE == 0)
            c = tl.sum(dots, axis=1) * r / N
            dy_f = dy.to(tl.float32)
            xhat = x.to(tl.float32) * r[:, None]
            dx = r[:, None] * (dy_f * w[None, :] - xhat * c[:, None])
            tl.store(DX + rows.to(tl.int64)[:, None] * stride_dx + cols[None, :],
                     dx.to(DX.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
            acc += _dw_terms(dy_f, xhat, X, GEMMA)
        dy, x = dy_ahead, x_ahead
    release_next_grid(PDL)
    if PHASE != 1:
        _store_dw(DW_PART + lane.to(tl.int64) * N, DW, cols, acc, col_ok, DIRECT)


@triton.jit
def _dw_reduce_kernel(PART, DW, G, N, BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr,
                      PDL: tl.constexpr):
    """dw[j] = Σ_p PART[p, j] over the G program partials, in fp32, one cast at the store."""
    wait_prior_grid(PDL)
    release_next_grid(PDL)
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < N
    acc = tl.zeros([BLOCK_G, BLOCK_C], dtype=tl.float32)
    for start in range(0, G, BLOCK_G):
        rows = start + tl.arange(0, BLOCK_G)
        mask = (rows < G)[:, None] & col_ok[None, :]
        acc += tl.load(PART + rows.to(tl.int64)[:, None] * N + cols[None, :], mask=mask,
                       other=0.0)
    tl.store(DW + cols, tl.sum(acc, axis=0).to(DW.dtype.element_ty), mask=col_ok)


def grid_size(m: int, config: BackwardConfig, sms: int) -> int:
    """Programs of the persistent grid: GRID_MULT per SM, never more than there are row blocks."""
    return max(1, min(config.GRID_MULT * sms, triton.cdiv(m, config.ROWS)))


def reduce_launch(n: int, g: int, sms: int) -> tuple[int, int, int, int]:
    """(programs, BLOCK_C, BLOCK_G, num_warps) of the reduction of `g` partial rows: each
    program sums all of them (up to `REDUCE_MAX_ROWS` a step) for BLOCK_C columns, 8 or more,
    in a tile of at most `REDUCE_TILE` values, about two programs per SM where the tile allows.

    The steps wait on each other, so one step is best: narrow columns of all the partials at
    once beat wider columns in several steps, each a round trip to L2. A few partials need no
    more than one program per 32 columns (`REDUCE_MIN_TILE`): more programs of less work each
    measured slower. Fewer than `REDUCE_MIN_ROWS` partials make a tile of their own rows, not
    16 of which most are masked, so its columns widen to the tile, which measurably shortens
    the backward of few rows."""
    block_g = min(next_pow2(g), REDUCE_MAX_ROWS)
    block_c = max(8, REDUCE_MIN_TILE // max(block_g, REDUCE_MIN_ROWS),
                  min(1024, REDUCE_TILE // block_g, next_pow2(triton.cdiv(n, 2 * sms))))
    return triton.cdiv(n, block_c), block_c, block_g, max(1, min(8, block_c * block_g // 512))


def describe_rmsnorm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, offset: float,
    config: BackwardConfig,
) -> Described:
    """The backward on (M, N) views with unit stride along N (rows may be strided).

    Outputs dx (M, N) in x.dtype and dw (N,) in weight.dtype. Each launch is placed while the
    one before it finishes (sm_90+; `_dependent_launch`). ValueError for a config no launch
    can run right (`kerneltune.kernels.rmsnorm_fwd.refuse_unrunnable`, and a DW of none of
    `DW_MODES`).
    """
    m, n = x.shape
    mode = config.DW
    if mode not in DW_MODES:
        raise ValueError(f"cannot launch {config!r}: DW={mode!r} is not one of {DW_MODES}")
    # A whole row in registers, unless the columns or the split take it a chunk at a time.
    refuse_unrunnable(config, n, config.SINGLE and mode in ("registers", "global"))
    dx = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return Described((dx, torch.zeros((n,), dtype=weight.dtype, device=weight.device)), ())
    sms = sm_count(x.device)
    block, rows, gemma = config.BLOCK_N, config.ROWS, offset != 0.0
    read_once = "evict_first" if config.EVICT else ""
    read_twice = "evict_last" if config.EVICT else ""
    pdl_on = dependent_launch(x.device)
    pdl = {"PDL": pdl_on, "launch_pdl": pdl_on}
    grid = _coop.lane_count(x, config) if mode == "split" else grid_size(m, config, sms)
    dw = torch.empty((n,), dtype=weight.dtype, device=weight.device)
    # One program per column (one row block): it writes dw itself, with no reduction launch.
    direct = grid == 1 and mode in ("split", "registers")
    partial = dw if direct else torch.empty((grid, n), dtype=torch.float32, device=x.device)
    strides = (dy.stride(0), x.stride(0), dx.stride(0), m, n, float(offset))
    launches: tuple[Launch, ...]
    scratch: tuple[torch.Tensor, ...] = ()
    if mode == "split":
        parts, launches = _coop_dependent.launches(
            _rmsnorm_bwd_split_kernel, x, config, 1, dy, x, weight, rstd, dx, partial, dw,
            *strides, pdl=pdl_on, DIRECT=direct, GEMMA=gemma, EVICT=config.EVICT)
        scratch = (parts,)
    elif mode == "columns":
        c = torch.empty((m,), dtype=torch.float32, device=x.device)
        launches = (
            Launch(_row_dot_kernel, (triton.cdiv(m, rows),),
                   (dy, x, weight, rstd, c, dy.stride(0), x.stride(0), m, n, float(offset)),
                   {"BLOCK_N": block, "ROWS": rows, "READ_TWICE": read_twice, **pdl,
                    **launch_options(config)}),
            Launch(_dx_dw_columns_kernel, (grid, triton.cdiv(n, block)),
                   (dy, x, weight, rstd, c, dx, partial, *strides),
                   {"BLOCK_N": block, "ROWS": rows, "GEMMA": gemma, "READ_ONCE": read_once,
                    **pdl, **launch_options(config)}))
    else:
        launches = (Launch(
            _rmsnorm_bwd_kernel, (grid,), (dy, x, weight, rstd, dx, partial, dw, *strides),
            {"BLOCK_N": block, "ROWS": rows, "SINGLE": config.SINGLE,
             "PREFETCH": config.PREFETCH, "DW_REGS": config.DW == "registers",
             "DIRECT": direct, "GEMMA": gemma, "READ_ONCE": read_once,
             "READ_TWICE": read_twice, **pdl, **launch_options(config)}),)
    if not direct:
        programs, block_c, block_g, warps = reduce_launch(n, grid, sms)
        launches += (Launch(_dw_reduce_kernel, (programs,), (partial, dw, grid, n),
                            {"BLOCK_G": block_g, "BLOCK_C": block_c, "num_warps": warps,
                             **pdl}),)
    return Described((dx, dw), launches, scratch)


def rmsnorm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, offset: float,
    config: BackwardConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `describe_rmsnorm_bwd`: dx (M, N) in x.dtype and dw (N,) in weight.dtype."""
    return run(describe_rmsnorm_bwd(dy, x, weight, rstd, offset, config))
