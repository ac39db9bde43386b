"""RMSNorm backward: dx and dw from dy, the forward's input x and its saved rstd.

Maths (the gradient of :mod:`kerneltune.kernels.rmsnorm_fwd`), everything in fp32::

    x̂  = x · r                       r = rstd saved by the forward (fp32, one per row)
    g   = dy · (w + offset)
    dx  = r · (g − x̂ · mean(g · x̂))  mean over N; one cast to x.dtype
    dw  = Σ_rows dy · x̂ᵥ              accumulated in fp32, one cast to weight.dtype

where x̂ᵥ is the value the forward multiplied w by: in llama mode (offset = 0) x̂ rounded to
x.dtype, ``(x · r).to(x.dtype)`` with the product in fp32; in gemma mode (offset ≠ 0) x̂ itself
in fp32. The rounding is treated as the identity for dx (straight-through), as autograd does
through a cast.

Schedule: a persistent grid of GRID = min(GRID_MULT · SMs, ⌈M / ROWS⌉) programs; program p
handles row blocks p, p + GRID, … of ROWS rows each and accumulates its share of dw in fp32.

- SINGLE (BLOCK_N ≥ N): a row block lives in registers; one read of x and dy gives the row's
  mean(g·x̂), dx and the dw contribution. The program's dw partial lives in registers
  (DW = "registers") and is stored once at the end, or in its private row of the fp32 partial
  buffer (DW = "global"), which frees the registers for larger blocks. With PREFETCH the
  next row block's loads are issued before this one's arithmetic (two blocks in flight per
  program, the next one held as stored).
- looped (BLOCK_N < N), DW = "global": each row block takes two passes over BLOCK_N chunks,
  the first for mean(g·x̂), the second for dx and dw (its re-read is served by L2 when EVICT
  keeps the chunk there). A whole-row dw partial does not fit in registers, so each chunk's
  contribution is added into the program's private fp32 partial row in global memory (plain
  load-add-store: no other program touches it; the first row block stores instead, so the
  buffer needs no zeroing). Its traffic stays in L2 while GRID rows of partials and of x, dy
  fit there.
- looped, DW = "columns": for rows too long for that, a first kernel computes each row's
  mean(g·x̂) (reading x and dy once), then a 2-D grid of (GRID, ⌈N / BLOCK_N⌉) programs gives
  each program a column chunk and every GRID-th row block: dx from the saved mean, the dw
  partial of its columns in registers. x and dy are read twice from memory, but nothing else
  is: 10 bytes per bf16 element against 6, whatever N.

- looped, DW = "split": the row is split over Q = ⌈N / BLOCK_N⌉ cooperating programs, so
  that x and dy are read once and never leave registers: program (p, q) owns column chunk q
  and the row blocks p, p + P, … of lane p (P = ⌊SMs / Q⌋ lanes). For each row block every
  program of the lane stores its chunk's Σ g·x per row, arrives at the lane's counter and
  waits until all Q have, then sums the Q dots in a fixed order (so dx is deterministic) and
  writes its chunk of dx; the dw partial of its columns stays in registers. The wait needs
  the P·Q ≤ SMs programs co-resident, one per SM: the launcher falls back to "columns" where
  Q > SMs. The next row block's loads are issued before the wait. The interpreter runs
  programs one after another, where a wait would never end: there the same kernel runs
  twice, the dots first (PHASE 1), then dx and dw (PHASE 2).

The (GRID, N) fp32 partials are then summed over programs by a small second kernel, which casts
to weight.dtype; it loads up to 256 partial rows of a column block at a time, so that the sum
takes a few dependent round trips to L2, not one per 16 programs. No M × N fp32 buffer is ever
made; the extra traffic is GRID · N · 4 bytes written and read once, which GRID_MULT trades
against latency hiding. Where one program holds all of a column's rows (a grid of one, with
DW = "registers" or "split"), it writes dw itself: one launch, which at M = 1 is most of the
time.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kerneltune.kernels._spec import (
    Config,
    interpreting,
    launch_options,
    next_pow2,
)

#: SMs assumed without a GPU (interpreter, CPU): a few programs, so the persistent loop and the
#: partial reduction are exercised with several row blocks per program.
INTERPRETER_SMS = 4
#: Partial rows the reduction kernel adds per step, at least and at most (see `reduce_launch`).
REDUCE_MIN_ROWS = 16
REDUCE_MAX_ROWS = 256
#: fp32 values one reduction program loads per step (16 per thread at 8 warps).
REDUCE_TILE = 4096


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
    READ_ONCE: tl.constexpr, READ_TWICE: tl.constexpr,
):
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


@triton.jit
def _row_dot_kernel(
    DY, X, W, RSTD, C, stride_dy, stride_x, M, N, offset,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, READ_TWICE: tl.constexpr,
):
    """C[row] = mean(g · x̂) = r · Σ_N(dy · (w + offset) · x) / N for ROWS rows per program."""
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
    tl.store(C + rows, tl.sum(gx, axis=1) * r / N, mask=row_ok)


@triton.jit
def _dx_dw_columns_kernel(
    DY, X, W, RSTD, C, DX, DW_PART,
    stride_dy, stride_x, stride_dx, M, N, offset,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, GEMMA: tl.constexpr, READ_ONCE: tl.constexpr,
):
    """Program (p, q) owns columns q·BLOCK_N … and row blocks p, p + grid(0), …: dx from the
    rows' C, and the dw partial of its columns in registers, stored once into row p."""
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
    tl.store(DW_PART + pid.to(tl.int64) * N + cols, acc, mask=col_ok)


@triton.jit
def _rmsnorm_bwd_split_kernel(
    DY, X, W, RSTD, DX, DW_PART, DW, DOTS, ARRIVED,
    stride_dy, stride_x, stride_dx, M, N, offset, Q,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, Q_POW2: tl.constexpr, PHASE: tl.constexpr,
    DIRECT: tl.constexpr, GEMMA: tl.constexpr, READ_ONCE: tl.constexpr,
):
    """Program (p, q) = divmod(pid, Q): column chunk q of lane p's row blocks (DW = "split").

    DOTS[row, q] holds chunk q's Σ g·x of a row; ARRIVED[p] counts the arrivals of lane p's
    programs, Q per row block. PHASE 0 does everything in one launch; PHASE 1 only the dots,
    PHASE 2 only dx and dw (two launches, nothing to wait for).
    """
    pid = tl.program_id(0)
    lane = pid // Q
    n_lanes = tl.num_programs(0) // Q
    cols = (pid % Q) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32) + offset
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    dy_next, x_next, r_next = _load_block(DY, X, RSTD, lane, cols, col_ok, stride_dy, stride_x,
                                          M, ROWS, READ_ONCE)
    for rb in range(lane, tl.cdiv(M, ROWS), n_lanes):
        dy_raw, x_raw, r = dy_next, x_next, r_next
        dy_next, x_next, r_next = _load_block(DY, X, RSTD, rb + n_lanes, cols, col_ok,
                                              stride_dy, stride_x, M, ROWS, READ_ONCE)
        x, dy = x_raw.to(tl.float32), dy_raw.to(tl.float32)
        rows = rb * ROWS + tl.arange(0, ROWS)
        row_ok = rows < M
        g = dy * w[None, :]
        if PHASE != 2:
            tl.store(DOTS + rows * Q + pid % Q, tl.sum(g * x, axis=1), mask=row_ok)
        if PHASE == 0:
            # Every thread's dots are stored before one thread releases them to the lane.
            tl.debug_barrier()
            tl.atomic_add(ARRIVED + lane, 1, sem="release")
            target = ((rb - lane) // n_lanes + 1) * Q
            seen = tl.atomic_add(ARRIVED + lane, 0, sem="acquire")
            while seen < target:
                seen = tl.atomic_add(ARRIVED + lane, 0, sem="acquire")
        if PHASE != 1:
            qs = tl.arange(0, Q_POW2)
            # From L2 (.cg): other programs wrote these, and L1 is not coherent.
            dots = tl.load(DOTS + rows[:, None] * Q + qs[None, :],
                           mask=row_ok[:, None] & (qs < Q)[None, :], other=0.0,
                           cache_modifier=".cg")
            c = tl.sum(dots, axis=1) * r / N
            xhat = x * r[:, None]
            dx = r[:, None] * (g - xhat * c[:, None])
            tl.store(DX + rows.to(tl.int64)[:, None] * stride_dx + cols[None, :],
                     dx.to(DX.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
            acc += _dw_terms(dy, xhat, X, GEMMA)
    if PHASE != 1:
        _store_dw(DW_PART + lane.to(tl.int64) * N, DW, cols, acc, col_ok, DIRECT)


@triton.jit
def _dw_reduce_kernel(PART, DW, G, N, BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr):
    """dw[j] = Σ_p PART[p, j] over the G program partials, in fp32, one cast at the store."""
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < N
    acc = tl.zeros([BLOCK_G, BLOCK_C], dtype=tl.float32)
    for start in range(0, G, BLOCK_G):
        rows = start + tl.arange(0, BLOCK_G)
        mask = (rows < G)[:, None] & col_ok[None, :]
        acc += tl.load(PART + rows.to(tl.int64)[:, None] * N + cols[None, :], mask=mask,
                       other=0.0)
    tl.store(DW + cols, tl.sum(acc, axis=0).to(DW.dtype.element_ty), mask=col_ok)


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device | str) -> int:
    """Streaming multiprocessors of the device the kernel runs on (a fixed few without a GPU)."""
    device = torch.device(device)
    if device.type != "cuda" or interpreting():
        return INTERPRETER_SMS
    return _cuda_sm_count(device.index if device.index is not None else
                          torch.cuda.current_device())


def grid_size(m: int, config: Config, sms: int) -> int:
    """Programs of the persistent grid: GRID_MULT per SM, never more than there are row blocks."""
    return max(1, min(int(config["GRID_MULT"]) * sms, triton.cdiv(m, int(config["ROWS"]))))


def split_lanes(m: int, n: int, config: Config, sms: int) -> int:
    """Lanes of the split grid: as many as fit beside each other, one program per SM, each lane
    taking ⌈N / BLOCK_N⌉ programs; never more than there are row blocks."""
    chunks = triton.cdiv(n, int(config["BLOCK_N"]))
    return max(1, min(sms // chunks, triton.cdiv(m, int(config["ROWS"]))))


def reduce_launch(n: int, g: int, sms: int) -> tuple[int, int, int, int]:
    """(programs, BLOCK_C, BLOCK_G, num_warps) of the reduction of `g` partial rows: about two
    programs per SM over the columns (32 to 1024 columns each); each step loads a tile of
    BLOCK_G partial rows of up to `REDUCE_TILE` values, so that a few steps cover all g rows.
    (The steps wait on each other: with 16 rows a step, 264 partials took 17 dependent round
    trips to L2, a sizeable part of the whole backward at 4096 x 4096.)"""
    block_c = max(32, min(1024, next_pow2(triton.cdiv(n, 2 * sms))))
    block_g = max(REDUCE_MIN_ROWS, min(next_pow2(g), REDUCE_TILE // block_c, REDUCE_MAX_ROWS))
    return triton.cdiv(n, block_c), block_c, block_g, max(1, min(8, block_c * block_g // 512))


def rmsnorm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, offset: float,
    config: Config,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch on (M, N) views with unit stride along N (rows may be strided).

    Returns dx (M, N) in x.dtype and dw (N,) in weight.dtype.
    """
    m, n = x.shape
    dx = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return dx, torch.zeros((n,), dtype=weight.dtype, device=weight.device)
    sms = sm_count(x.device)
    block, rows, gemma = int(config["BLOCK_N"]), int(config["ROWS"]), offset != 0.0
    read_once = "evict_first" if config["EVICT"] else ""
    read_twice = "evict_last" if config["EVICT"] else ""
    mode = config["DW"]
    chunks = triton.cdiv(n, block)
    if mode == "split" and chunks > sms and not interpreting():
        mode = "columns"  # the lane's programs could not all be resident at once
    grid = split_lanes(m, n, config, sms) if mode == "split" else grid_size(m, config, sms)
    dw = torch.empty((n,), dtype=weight.dtype, device=weight.device)
    # One program per column (one row block): it writes dw itself, with no reduction launch.
    direct = grid == 1 and mode in ("split", "registers")
    partial = dw if direct else torch.empty((grid, n), dtype=torch.float32, device=x.device)
    if mode == "split":
        dots = torch.empty((m, chunks), dtype=torch.float32, device=x.device)
        arrived = torch.zeros((grid,), dtype=torch.int32, device=x.device)
        for phase in (1, 2) if interpreting() else (0,):
            _rmsnorm_bwd_split_kernel[(grid * chunks,)](
                dy, x, weight, rstd, dx, partial, dw, dots, arrived,
                dy.stride(0), x.stride(0), dx.stride(0), m, n, float(offset), chunks,
                BLOCK_N=block, ROWS=rows, Q_POW2=next_pow2(chunks), PHASE=phase, DIRECT=direct,
                GEMMA=gemma, READ_ONCE=read_once, **launch_options(config),
            )
    elif mode == "columns":
        c = torch.empty((m,), dtype=torch.float32, device=x.device)
        _row_dot_kernel[(triton.cdiv(m, rows),)](
            dy, x, weight, rstd, c, dy.stride(0), x.stride(0), m, n, float(offset),
            BLOCK_N=block, ROWS=rows, READ_TWICE=read_twice, **launch_options(config),
        )
        _dx_dw_columns_kernel[(grid, triton.cdiv(n, block))](
            dy, x, weight, rstd, c, dx, partial,
            dy.stride(0), x.stride(0), dx.stride(0), m, n, float(offset),
            BLOCK_N=block, ROWS=rows, GEMMA=gemma, READ_ONCE=read_once,
            **launch_options(config),
        )
    else:
        _rmsnorm_bwd_kernel[(grid,)](
            dy, x, weight, rstd, dx, partial, dw,
            dy.stride(0), x.stride(0), dx.stride(0), m, n, float(offset),
            BLOCK_N=block, ROWS=rows, SINGLE=config["SINGLE"],
            PREFETCH=config.get("PREFETCH", False), DW_REGS=config["DW"] == "registers",
            DIRECT=direct, GEMMA=gemma,
            READ_ONCE=read_once, READ_TWICE=read_twice, **launch_options(config),
        )
    if direct:
        return dx, dw
    programs, block_c, block_g, warps = reduce_launch(n, grid, sms)
    _dw_reduce_kernel[(programs,)](
        partial, dw, grid, n, BLOCK_G=block_g, BLOCK_C=block_c, num_warps=warps,
    )
    return dx, dw
