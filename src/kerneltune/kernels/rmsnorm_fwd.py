"""RMSNorm forward: y = rmsnorm(x) · w, saving the per-row rstd for backward.

Maths (HF Llama RMSNorm is the reference; Liger calls the two casting modes llama and gemma)::

    r     = 1 / sqrt(mean(x², over N, in fp32) + eps)
    llama (offset = 0):  y = w · (x · r).to(x.dtype)          product in fp32, one cast
    gemma (offset ≠ 0):  y = (x · r · (offset + w)).to(x.dtype) all in fp32, one cast
    rstd  = r (fp32, one per row)

Design: one program normalises ROWS rows.

- SINGLE (BLOCK_N ≥ N): the row block in registers, one read of x. On a persistent grid
  (GRID_MULT > 1, registers capped by `kerneltune.kernels._coop.resident_options`) each
  program takes every P-th row block and loads the next while it normalises this one, its
  weight loaded once: one program per row block has its next rows in flight only through the
  other programs its SM holds, and the last wave leaves SMs idle.
- Looped: two passes over BLOCK_N chunks, the sum of squares, then normalise and store; the
  second read is served by L2 when EVICT keeps the row there.
- COOP: each row split over ⌈N / BLOCK_N⌉ cooperating programs (`kerneltune.kernels._coop`),
  each holding its chunk in registers, so x is read once whatever N and a few long rows still
  fill the GPU. The chunks agree once, on r; with one row a block Triton pipelines the row
  loop (num_stages, `kerneltune.kernels._coop_row`).

On sm_90 and later the one-launch kernel is a programmatic dependent launch
(`kerneltune.kernels._dependent_launch`): it waits for the grid before it ahead of any load or
store, so back-to-back launches overlap. A whole row's program releases the next grid after its
last load, or as it exits (LATE_RELEASE); the loop releases after its stores. Releasing early
places the next grid sooner, which pays at few rows, but keeps the row live across the release:
more registers a thread, so fewer programs an SM where many row blocks want them all. The
cooperative split is launched the ordinary way.

References: the Triton layer-norm tutorial (the row tiling and loop); Liger's ``rms_norm``;
QuACK, which splits a long row over a thread-block cluster where this splits it over programs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kerneltune.kernels import _coop, _coop_norm, _coop_pair, _coop_row, _dependent_launch
from kerneltune.kernels._config import BackwardConfig, ForwardConfig, RowTilingConfig
from kerneltune.kernels._coop import gather, lane_chunk, load_rows, publish
from kerneltune.kernels._coop_norm import lane_rstd
from kerneltune.kernels._coop_row import gather_row, store_row_scalar
from kerneltune.kernels._dependent_launch import release_next_grid, wait_prior_grid
from kerneltune.kernels._launch import Described, Launch, run
from kerneltune.kernels._spec import dependent_launch, launch_options, row_block_grid

#: Version of the launcher's grids, arguments, constexprs and launch options: part of the kernel
#: hash, raised whenever a host-side change alters what the GPU is asked to run.
LAUNCH_VERSION = 1
#: Shared Triton functions this module calls: hashed with it.
DEVICE_CODE_FROM = (_coop, _coop_norm, _coop_pair, _coop_row, _dependent_launch)


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
def _normalize_persistent(X, W, Y, RSTD, stride_x, stride_y, M, N, eps, offset,
                          BLOCK_N: tl.constexpr, ROWS: tl.constexpr, GEMMA: tl.constexpr,
                          EVICT: tl.constexpr, LATE_RELEASE: tl.constexpr, PDL: tl.constexpr):
    """PERSIST: the whole rows (one block) of row blocks pid, pid + P, ... (P programs), each
    program loading its next row block while it normalises this one, its weight in registers
    for all of them."""
    step = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    x_next = load_rows(X, tl.program_id(0), cols, col_ok, stride_x, M, ROWS, EVICT)
    blocks = tl.cdiv(M, ROWS)
    for rb in range(tl.program_id(0), blocks, step):
        x = x_next.to(tl.float32)
        x_next = load_rows(X, rb + step, cols, col_ok, stride_x, M, ROWS, EVICT)
        if not LATE_RELEASE:  # noqa: SIM102 - a compile-time branch around a runtime one
            if rb + step >= blocks:  # the last block: nothing left to load
                release_next_grid(PDL)
        rows = rb * ROWS + tl.arange(0, ROWS)
        row_ok = rows < M
        r = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
        y = _normalize(x, r[:, None], w[None, :], offset, GEMMA, Y.dtype.element_ty)
        tl.store(Y + rows.to(tl.int64)[:, None] * stride_y + cols[None, :], y,
                 mask=row_ok[:, None] & col_ok[None, :])
        tl.store(RSTD + rows, r, mask=row_ok)


@triton.jit
def _rmsnorm_fwd_kernel(
    X, W, Y, RSTD,
    stride_x, stride_y, M, N,
    eps, offset,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, SINGLE: tl.constexpr,
    GEMMA: tl.constexpr, EVICT: tl.constexpr, PERSIST: tl.constexpr,
    LATE_RELEASE: tl.constexpr, PDL: tl.constexpr,
):
    wait_prior_grid(PDL)
    if PERSIST:
        _normalize_persistent(X, W, Y, RSTD, stride_x, stride_y, M, N, eps, offset, BLOCK_N,
                              ROWS, GEMMA, EVICT, LATE_RELEASE, PDL)
    else:
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
            if not LATE_RELEASE:
                release_next_grid(PDL)
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
            release_next_grid(PDL)
        tl.store(RSTD + rows, r, mask=row_ok)


@triton.jit
def _normalize_split_rows(PART, NQ, X, Y, RSTD, stride_x, stride_y, M, N, eps, offset, x, w,
                          lane, n_lanes, q, cols, col_ok, NQ_POW2: tl.constexpr,
                          PHASE: tl.constexpr, GEMMA: tl.constexpr, EVICT: tl.constexpr,
                          STAGES: tl.constexpr):
    """The split's row loop with one row a block (x: the lane's first row, its partial
    published): each step loads the next row, publishes its partial, then normalises this row
    from its gathered partials (`kerneltune.kernels._coop_row`). The load is Triton's to
    schedule: with STAGES > 1 it is issued STAGES - 1 steps early, into shared memory."""
    for row in tl.range(lane, M, n_lanes, num_stages=STAGES):
        x_ahead = load_rows(X, row + n_lanes, cols, col_ok, stride_x, M, 1, EVICT).to(tl.float32)
        if PHASE <= 1:
            publish(PART, row + n_lanes, q, NQ, M, tl.sum(x_ahead * x_ahead, axis=1), 1)
        if PHASE != 1:
            r = tl.rsqrt(tl.sum(gather_row(PART, row, NQ, NQ_POW2, PHASE == 0)) / N + eps)
            store_row_scalar(RSTD, row, r, q, M, NQ_POW2)
            y = _normalize(x, r, w[None, :], offset, GEMMA, Y.dtype.element_ty)
            rows = (row + tl.arange(0, 1)).to(tl.int64)
            tl.store(Y + rows[:, None] * stride_y + cols[None, :], y, mask=col_ok[None, :])
        x = x_ahead


@triton.jit
def _rmsnorm_fwd_coop_kernel(
    PART, NQ, X, W, Y, RSTD, stride_x, stride_y, M, N, eps, offset,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, NQ_POW2: tl.constexpr, PHASE: tl.constexpr,
    GEMMA: tl.constexpr, EVICT: tl.constexpr, STAGES: tl.constexpr,
):
    """COOP (see `kerneltune.kernels._coop`) over NQ chunks: a row's chunks agree once, on the
    sum of squares (PART[row, q]). PHASE 0 does it all in one launch; PHASE 1 and 2 are its
    steps apart: the partial sums, the stores.

    Pipelined one row block deep: a program publishes the next block's partials before it
    gathers this block's, so its peers' partials arrive while it works rather than while it
    waits. One row a block takes `_normalize_split_rows`, whose blocks are loaded ahead by
    Triton's pipeliner."""
    lane, n_lanes, q, cols, col_ok = lane_chunk(NQ, N, BLOCK_N)
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    x = load_rows(X, lane, cols, col_ok, stride_x, M, ROWS, EVICT).to(tl.float32)
    if PHASE <= 1:
        publish(PART, lane, q, NQ, M, tl.sum(x * x, axis=1), ROWS)
    if ROWS == 1:
        _normalize_split_rows(PART, NQ, X, Y, RSTD, stride_x, stride_y, M, N, eps, offset, x, w,
                              lane, n_lanes, q, cols, col_ok, NQ_POW2, PHASE, GEMMA, EVICT,
                              STAGES)
    else:
        x_next = load_rows(X, lane + n_lanes, cols, col_ok, stride_x, M, ROWS, EVICT)
        for rb in range(lane, tl.cdiv(M, ROWS), n_lanes):
            x_ahead = x_next.to(tl.float32)
            x_next = load_rows(X, rb + 2 * n_lanes, cols, col_ok, stride_x, M, ROWS, EVICT)
            if PHASE <= 1:
                publish(PART, rb + n_lanes, q, NQ, M, tl.sum(x_ahead * x_ahead, axis=1), ROWS)
            if PHASE != 1:
                rows = rb * ROWS + tl.arange(0, ROWS)
                row_ok = rows < M
                parts = gather(PART, rows, row_ok, NQ, NQ_POW2, PHASE == 0)
                r = lane_rstd(parts, RSTD, rows, row_ok, q, N, eps, NQ_POW2)
                y = _normalize(x, r[:, None], w[None, :], offset, GEMMA, Y.dtype.element_ty)
                tl.store(Y + rows.to(tl.int64)[:, None] * stride_y + cols[None, :], y,
                         mask=row_ok[:, None] & col_ok[None, :])
            x = x_ahead


#: Most elements Triton takes in one block (its TRITON_MAX_TENSOR_NUMEL): a larger row block
#: is refused by the launchers rather than inside Triton.
MAX_TILE_ELEMS = 1 << 20


def refuse_unrunnable(config: RowTilingConfig | BackwardConfig, n: int, whole_row: bool) -> None:
    """A ValueError for a config the launchers cannot run right, whatever its source: a grid
    that would not cover every row (ROWS or GRID_MULT below 1), a zero divisor (ROWS, BLOCK_N,
    num_warps of 0), a block Triton cannot tile (not a power-of-two int, more than
    `MAX_TILE_ELEMS` elements), or a whole row (`whole_row`) that one block of BLOCK_N does not
    hold. Tuned configs are checked in full where they enter (`KernelSpec.parse`); this is the
    launchers' own floor, a few attribute checks, so that no config, whatever its source, leads
    to uninitialized output. Shared by the family's launchers.
    """
    block, rows, warps = config.BLOCK_N, config.ROWS, config.num_warps
    stages, per_sm = config.num_stages, config.GRID_MULT
    if (type(block) is int and type(rows) is int and type(warps) is int
            and type(stages) is int and type(per_sm) is int
            and block > 0 and rows > 0 and warps > 0 and stages > 0 and per_sm > 0
            and not (block & (block - 1) or rows & (rows - 1) or warps & (warps - 1))
            and block * rows <= MAX_TILE_ELEMS and (block >= n or not whole_row)):
        return
    raise ValueError(f"cannot launch {config!r} on rows of {n}: {_unrunnable(config, n)}")


def _unrunnable(config: RowTilingConfig | BackwardConfig, n: int) -> str:
    """What `refuse_unrunnable` found wrong, parameter by parameter."""
    wrong = []
    for name in ("BLOCK_N", "ROWS", "num_warps", "num_stages", "GRID_MULT"):
        value = getattr(config, name)
        pow2 = name in ("BLOCK_N", "ROWS", "num_warps")
        if type(value) is not int or value < 1 or (pow2 and value & (value - 1)):
            wrong.append(f"{name}={value!r} is not a positive "
                         + ("power-of-two int" if pow2 else "int"))
    if wrong:
        return "; ".join(wrong)
    if config.BLOCK_N * config.ROWS > MAX_TILE_ELEMS:
        return (f"a block of BLOCK_N x ROWS = {config.BLOCK_N * config.ROWS} elements is more "
                f"than Triton's {MAX_TILE_ELEMS}")
    return f"a whole row in one block of BLOCK_N={config.BLOCK_N} < {n}"


def describe_rmsnorm_fwd(
    x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float, config: ForwardConfig,
    pdl: bool | None = None, rstd: torch.Tensor | None = None,
) -> Described:
    """The forward on a (M, N) view with unit stride along N: outputs y (M, N) and rstd (M,)
    fp32 (written to `rstd` where given, e.g. a scratch vector nobody reads).

    `pdl`: launch as a programmatic dependent launch (None: wherever the device has it).
    ValueError for a config no launch can run right (`refuse_unrunnable`)."""
    m, n = x.shape
    refuse_unrunnable(config, n, config.SINGLE and not config.COOP)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if rstd is None:
        rstd = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m == 0:
        return Described((y, rstd), ())
    if config.COOP:
        parts, launches = _coop.launches(
            _rmsnorm_fwd_coop_kernel, x, config, 1,
            x, weight, y, rstd, x.stride(0), y.stride(0), m, n, eps, offset,
            GEMMA=offset != 0.0, EVICT=config.EVICT, STAGES=config.num_stages)
        return Described((y, rstd), launches, (parts,))
    persist = config.GRID_MULT > 1
    if persist and not config.SINGLE:
        raise ValueError(f"a persistent grid (GRID_MULT={config.GRID_MULT}) runs a whole row "
                         f"in one block, not {config}")
    pdl = dependent_launch(x.device) if pdl is None else pdl
    return Described((y, rstd), (Launch(
        _rmsnorm_fwd_kernel, (row_block_grid(m, config, x.device),),
        (x, weight, y, rstd, x.stride(0), y.stride(0), m, n, eps, offset),
        {"BLOCK_N": config.BLOCK_N, "ROWS": config.ROWS, "SINGLE": config.SINGLE,
         "GEMMA": offset != 0.0, "EVICT": config.EVICT, "PERSIST": persist, "PDL": pdl,
         "LATE_RELEASE": config.LATE_RELEASE, "launch_pdl": pdl,
         **launch_options(config), **_coop.resident_options(config)}),))


def rmsnorm_fwd(
    x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float, config: ForwardConfig,
    pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `describe_rmsnorm_fwd`: y (M, N) and rstd (M,) fp32."""
    return run(describe_rmsnorm_fwd(x, weight, eps, offset, config, pdl))
