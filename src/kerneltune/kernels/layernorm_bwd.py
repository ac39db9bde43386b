"""LayerNorm backward: its kernels and the launcher of every DW mode.

Maths (everything in fp32, from dy and the forward's saved mean and rstd,
`kerneltune.kernels.layernorm`)::

    x̂  = (x − mean) · rstd
    c1 = Σ_N x̂ · (w · dy) / N,    c2 = Σ_N w · dy / N
    dx = (w · dy − (x̂ · c1 + c2)) · rstd
    dw = Σ_rows dy · x̂,   db = Σ_rows dy            accumulated in fp32

Whole rows and looped (DW = "registers", "global"), as `kerneltune.kernels.rmsnorm_bwd`'s: a
persistent grid of GRID = min(GRID_MULT · SMs, ⌈M / ROWS⌉) programs, program p taking row
blocks p, p + GRID, … and keeping fp32 partials of dw and db, in registers beside a whole row
(DW = "registers") or in its private row of a (GRID, N) buffer (DW = "global"; also the
looped case: two passes, c1 and c2, then dx and the partials). Plain load-add-store: no other
program touches the row, and the first row block stores, so the buffers need no zeroing.

The row split (DW = "split") takes each row over ⌈N / BLOCK_N⌉ cooperating programs
(`kerneltune.kernels._coop`), as `kerneltune.kernels.rmsnorm_bwd`'s split does. Chunk q of a
row publishes two partials, and every program of the row sums all of them in the same fixed
order::

    s1_q = Σ_q (x − mean) · (w · dy),   s2_q = Σ_q w · dy      over chunk q's columns
    c1 = rstd · Σ_Q s1_q / N             = Σ_N x̂ · (w · dy) / N
    c2 = Σ_Q s2_q / N                    = Σ_N w · dy / N

x and dy are read once and stay in registers beside the lane's dw and db partials (w is read
where used, `_times_w`), so a long row moves no more than its bytes, and a few long rows still
use every SM. The rows agree once, on both sums: the two partials go out in one step, into two
buffers (`_coop_dependent.launches` with values = 2), and come back in one wait
(`gather_pair`). A lane's partials of dw and db are stored once into its rows of two
(lanes, N) fp32 buffers; a grid of one lane writes dw and db itself (DIRECT), in one launch.

Every mode's partials of dw and db are summed by `rmsnorm_bwd`'s reduction kernel
(`reductions`), one launch for dw and one for db. On sm_90 and later every launch is a
programmatic dependent launch (`kerneltune.kernels._dependent_launch`).

Device code: the backward's kernel hash is this module's (`LayerNormBwd.kernel_module`), with
the modules whose Triton functions it launches or calls (`DEVICE_CODE_FROM`): the loads it
shares with the forward, `rmsnorm_bwd` (the reduction, the dw store) and the split's shared
code; not the forward's module, so that an edit to the forward leaves the backward's tuned
entries current.

References: the Triton layer-norm tutorial (the partial sums of dw and db); Liger's
``layer_norm``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kerneltune.kernels import (
    _coop,
    _coop_dependent,
    _coop_pair,
    _dependent_launch,
    _layernorm_loads,
    rmsnorm_bwd,
)
from kerneltune.kernels._config import BackwardConfig
from kerneltune.kernels._coop import lane_chunk, load_rows, publish
from kerneltune.kernels._coop_pair import gather_pair
from kerneltune.kernels._dependent_launch import release_next_grid, wait_prior_grid
from kerneltune.kernels._launch import Described, Launch, run
from kerneltune.kernels._layernorm_loads import column_vector, load_f32
from kerneltune.kernels._spec import dependent_launch, launch_options, sm_count
from kerneltune.kernels.layernorm import _eviction
from kerneltune.kernels.rmsnorm_bwd import (
    NEXT_TO_UNSET,
    _dw_reduce_kernel,
    _store_dw,
    grid_size,
    reduce_launch,
)
from kerneltune.kernels.rmsnorm_fwd import refuse_unrunnable

#: Version of the launcher's grids, arguments, constexprs and launch options: part of the kernel
#: hash, raised whenever a host-side change alters what the GPU is asked to run.
LAUNCH_VERSION = 1
#: Triton functions this module launches or calls from other modules: hashed with it.
DEVICE_CODE_FROM = (_layernorm_loads, rmsnorm_bwd, _coop, _coop_dependent, _coop_pair,
                    _dependent_launch)

#: Where the dw and db partials live (`layernorm`'s docstring, and the split above); a config
#: naming another is refused.
DW_MODES = ("registers", "global", "split")


@triton.jit
def _dx(xhat, wdy, rstd, c1, c2):
    """dx = (w · dy − (x̂ · c1 + c2)) · rstd of a block (fp32)."""
    return (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]


@triton.jit
def _add_partial(PART, c, c_ok, terms, rb, pid):
    """The block's terms, summed over its rows, into the program's partial row: stored by its
    first row block, added by the later ones. (The predicate is a vector: the interpreter
    rejects a scalar one in a mask.)"""
    later = (c * 0 + rb) != pid
    prev = tl.load(PART + c, mask=c_ok & later, other=0.0)
    tl.store(PART + c, prev + tl.sum(terms, axis=0), mask=c_ok)


@triton.jit
def _layernorm_bwd_kernel(
    DY, X, W, MEAN, RSTD, DX, DW_PART, DB_PART,
    stride_dy, stride_x, stride_dx, M, N,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, SINGLE: tl.constexpr, DW_REGS: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, READ_ONCE: tl.constexpr,
    READ_TWICE: tl.constexpr, PDL: tl.constexpr,
):
    wait_prior_grid(PDL)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    dw_row = DW_PART + pid.to(tl.int64) * N
    db_row = DB_PART + pid.to(tl.int64) * N
    acc_w = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_N], dtype=tl.float32)
    if SINGLE:
        w = column_vector(W, cols, cols < N, HAS_W, 1.0)
    for rb in range(pid, tl.cdiv(M, ROWS), tl.num_programs(0)):
        rows = rb * ROWS + tl.arange(0, ROWS)
        row_ok = rows < M
        mean = tl.load(MEAN + rows, mask=row_ok, other=0.0)
        rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
        rows64 = rows.to(tl.int64)
        x_rows = X + rows64[:, None] * stride_x
        dy_rows = DY + rows64[:, None] * stride_dy
        dx_rows = DX + rows64[:, None] * stride_dx
        if SINGLE:
            col_ok = cols < N
            mask = row_ok[:, None] & col_ok[None, :]
            x = load_f32(x_rows + cols[None, :], mask, READ_ONCE)
            dy = load_f32(dy_rows + cols[None, :], mask, READ_ONCE)
            xhat = (x - mean[:, None]) * rstd[:, None]
            wdy = dy * w[None, :]
            c1 = tl.sum(xhat * wdy, axis=1) / N
            c2 = tl.sum(wdy, axis=1) / N
            dx = _dx(xhat, wdy, rstd, c1, c2)
            tl.store(dx_rows + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
            if DW_REGS:
                if HAS_W:
                    acc_w += tl.sum(dy * xhat, axis=0)
                if HAS_B:
                    acc_b += tl.sum(dy, axis=0)
            else:
                if HAS_W:
                    _add_partial(dw_row, cols, col_ok, dy * xhat, rb, pid)
                if HAS_B:
                    _add_partial(db_row, cols, col_ok, dy, rb, pid)
        else:
            # Pass 1: c1 and c2 of the rows over the chunks, kept in L2 for pass 2 (EVICT).
            s1 = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
            s2 = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
            for start in range(0, N, BLOCK_N):
                c = start + cols
                c_ok = c < N
                mask = row_ok[:, None] & c_ok[None, :]
                x = load_f32(x_rows + c[None, :], mask, READ_TWICE)
                dy = load_f32(dy_rows + c[None, :], mask, READ_TWICE)
                wdy = dy * column_vector(W, c, c_ok, HAS_W, 1.0)[None, :]
                s1 += (x - mean[:, None]) * rstd[:, None] * wdy
                s2 += wdy
            c1 = tl.sum(s1, axis=1) / N
            c2 = tl.sum(s2, axis=1) / N
            # Pass 2: dx, and dw and db into the program's partial rows.
            for start in range(0, N, BLOCK_N):
                c = start + cols
                c_ok = c < N
                mask = row_ok[:, None] & c_ok[None, :]
                x = load_f32(x_rows + c[None, :], mask, READ_ONCE)
                dy = load_f32(dy_rows + c[None, :], mask, READ_ONCE)
                xhat = (x - mean[:, None]) * rstd[:, None]
                wdy = dy * column_vector(W, c, c_ok, HAS_W, 1.0)[None, :]
                dx = _dx(xhat, wdy, rstd, c1, c2)
                tl.store(dx_rows + c[None, :], dx.to(DX.dtype.element_ty), mask=mask)
                if HAS_W:
                    _add_partial(dw_row, c, c_ok, dy * xhat, rb, pid)
                if HAS_B:
                    _add_partial(db_row, c, c_ok, dy, rb, pid)
    release_next_grid(PDL)
    if DW_REGS:
        if HAS_W:
            tl.store(dw_row + cols, acc_w, mask=cols < N)
        if HAS_B:
            tl.store(db_row + cols, acc_b, mask=cols < N)


@triton.jit
def _published(value):
    """A partial as published: never `UNSET` (-1), which a gather takes for a slot not written
    yet, so a partial of exactly -1 goes out one ulp nearer zero."""
    return tl.where(value == _coop.UNSET, NEXT_TO_UNSET, value)


@triton.jit
def _times_w(dy, W, cols, col_ok, HAS_W: tl.constexpr):
    """w · dy in fp32, w loaded where used (dy alone where there is no w).

    Loaded twice a row block (an L1 or L2 hit) rather than held: the fp32 partials of dw and
    db already take the registers that RMSNorm's split gives w. Held beside them at 4K chunks
    of 8 warps, capped for two programs an SM (128 registers a thread), w took the row loop's
    local loads and stores from 23 to 79 (Triton 3.9, compiled for sm_90)."""
    if HAS_W:
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
        return dy.to(tl.float32) * w[None, :]
    return dy.to(tl.float32)


@triton.jit
def _chunk_partials(dy, x, W, cols, col_ok, mean, HAS_W: tl.constexpr):
    """Σ (x − mean) · w · dy and Σ w · dy of each row over the chunk, as published. Columns
    past N (and rows past M) hold dy = 0, so they add nothing."""
    wdy = _times_w(dy, W, cols, col_ok, HAS_W)
    s1 = tl.sum((x.to(tl.float32) - mean[:, None]) * wdy, axis=1)
    return _published(s1), _published(tl.sum(wdy, axis=1))


@triton.jit
def _block_stat(P, rb, M, ROWS: tl.constexpr):
    """Row block `rb`'s saved statistic (ROWS,), 0 past M."""
    rows = rb * ROWS + tl.arange(0, ROWS)
    return tl.load(P + rows, mask=rows < M, other=0.0)


@triton.jit
def _layernorm_bwd_split_kernel(
    PART_1, PART_2, NQ, DY, X, W, MEAN, RSTD, DX, DW_PART, DB_PART, DW, DB,
    stride_dy, stride_x, stride_dx, M, N,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, NQ_POW2: tl.constexpr, PHASE: tl.constexpr,
    DIRECT: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, EVICT: tl.constexpr,
    PDL: tl.constexpr,
):
    """DW = "split" over NQ chunks: a row's chunks agree once, on both sums, s1 in PART_1 and
    s2 in PART_2 (M x NQ each). PHASE 0 does it all in one launch; PHASE 1 and 2 are its steps
    apart: the partials, then dx, dw and db.

    Pipelined one row block deep, as `rmsnorm_bwd`'s split: a program publishes the next
    block's partials before it gathers this block's. The blocks stay as stored until used
    (three of x and dy are live: this one, the next, whose partials are out, and the one after
    it, loading); each block's mean goes with it, since its partials need it."""
    wait_prior_grid(PDL)
    lane, n_lanes, q, cols, col_ok = lane_chunk(NQ, N, BLOCK_N)
    acc_w = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_N], dtype=tl.float32)
    dy = load_rows(DY, lane, cols, col_ok, stride_dy, M, ROWS, EVICT)
    x = load_rows(X, lane, cols, col_ok, stride_x, M, ROWS, EVICT)
    mean = _block_stat(MEAN, lane, M, ROWS)
    if PHASE <= 1:
        s1, s2 = _chunk_partials(dy, x, W, cols, col_ok, mean, HAS_W)
        publish(PART_1, lane, q, NQ, M, s1, ROWS)
        publish(PART_2, lane, q, NQ, M, s2, ROWS)
    dy_next = load_rows(DY, lane + n_lanes, cols, col_ok, stride_dy, M, ROWS, EVICT)
    x_next = load_rows(X, lane + n_lanes, cols, col_ok, stride_x, M, ROWS, EVICT)
    mean_next = _block_stat(MEAN, lane + n_lanes, M, ROWS)
    for rb in range(lane, tl.cdiv(M, ROWS), n_lanes):
        dy_ahead, x_ahead, mean_ahead = dy_next, x_next, mean_next
        dy_next = load_rows(DY, rb + 2 * n_lanes, cols, col_ok, stride_dy, M, ROWS, EVICT)
        x_next = load_rows(X, rb + 2 * n_lanes, cols, col_ok, stride_x, M, ROWS, EVICT)
        mean_next = _block_stat(MEAN, rb + 2 * n_lanes, M, ROWS)
        if PHASE <= 1:
            s1, s2 = _chunk_partials(dy_ahead, x_ahead, W, cols, col_ok, mean_ahead, HAS_W)
            publish(PART_1, rb + n_lanes, q, NQ, M, s1, ROWS)
            publish(PART_2, rb + n_lanes, q, NQ, M, s2, ROWS)
        if PHASE != 1:
            rows = rb * ROWS + tl.arange(0, ROWS)
            row_ok = rows < M
            r = tl.load(RSTD + rows, mask=row_ok, other=0.0)
            p1, p2 = gather_pair(PART_1, rows, row_ok, PART_2, rows, row_ok, NQ, NQ_POW2,
                                 PHASE == 0)
            c1 = tl.sum(p1, axis=1) * r / N
            c2 = tl.sum(p2, axis=1) / N
            dy_f = dy.to(tl.float32)
            xhat = (x.to(tl.float32) - mean[:, None]) * r[:, None]
            dx = _dx(xhat, _times_w(dy, W, cols, col_ok, HAS_W), r, c1, c2)
            tl.store(DX + rows.to(tl.int64)[:, None] * stride_dx + cols[None, :],
                     dx.to(DX.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
            if HAS_W:
                acc_w += tl.sum(dy_f * xhat, axis=0)
            if HAS_B:
                acc_b += tl.sum(dy_f, axis=0)
        dy, x, mean = dy_ahead, x_ahead, mean_ahead
    release_next_grid(PDL)
    if PHASE != 1:
        if HAS_W:
            _store_dw(DW_PART + lane.to(tl.int64) * N, DW, cols, acc_w, col_ok, DIRECT)
        if HAS_B:
            _store_dw(DB_PART + lane.to(tl.int64) * N, DB, cols, acc_b, col_ok, DIRECT)


def describe_layernorm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
    mean: torch.Tensor, rstd: torch.Tensor, config: BackwardConfig,
) -> Described:
    """The backward on (M, N) views with unit stride along N (rows may be strided), from the
    forward's saved mean and rstd (M,) fp32.

    Outputs dx (M, N) in x.dtype, then dw (N,) in weight.dtype where there is a weight and db
    (N,) in bias.dtype where there is a bias (`bias` is read for nothing else). ValueError for
    a config no launch can run right (`refuse_unrunnable`, a DW of none of `DW_MODES`)."""
    m, n = x.shape
    if config.DW not in DW_MODES:
        raise ValueError(f"cannot launch {config!r}: DW={config.DW!r} is not one of {DW_MODES}")
    split = config.DW == "split"
    # A whole row in registers, unless the split takes it a chunk at a time.
    single = bool(config.SINGLE) and not split
    refuse_unrunnable(config, n, single)
    dx = torch.empty((m, n), dtype=x.dtype, device=x.device)
    sums = [t for t in (weight, bias) if t is not None]
    if m == 0:
        return Described((dx, *(torch.zeros((n,), dtype=t.dtype, device=t.device)
                                for t in sums)), ())
    sms, pdl_on = sm_count(x.device), dependent_launch(x.device)
    outputs = [torch.empty((n,), dtype=t.dtype, device=t.device) for t in sums]
    if split:
        return _describe_split(dy, x, weight, bias, mean, rstd, dx, outputs, config, sms, pdl_on)
    grid = grid_size(m, config, sms)
    partials = [torch.empty((grid, n), dtype=torch.float32, device=x.device) for _ in sums]
    # A kernel argument that is never read where its flag is off: any tensor at hand.
    dw_part = partials[0] if weight is not None else x
    db_part = partials[-1] if bias is not None else x
    read_once, read_twice = _eviction(config)
    launches = (Launch(
        _layernorm_bwd_kernel, (grid,),
        (dy, x, weight, mean, rstd, dx, dw_part, db_part, dy.stride(0), x.stride(0),
         dx.stride(0), m, n),
        {"BLOCK_N": config.BLOCK_N, "ROWS": config.ROWS, "SINGLE": single,
         "DW_REGS": single and config.DW == "registers", "HAS_W": weight is not None,
         "HAS_B": bias is not None, "READ_ONCE": read_once,
         "READ_TWICE": read_twice, "PDL": pdl_on, "launch_pdl": pdl_on,
         **launch_options(config)}),)
    return Described((dx, *outputs), launches + reductions(partials, outputs, sms, pdl_on))


def _describe_split(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
    mean: torch.Tensor, rstd: torch.Tensor, dx: torch.Tensor, outputs: list[torch.Tensor],
    config: BackwardConfig, sms: int, pdl: bool,
) -> Described:
    """`describe_layernorm_bwd` of a split over M ≥ 1 rows, into `dx` and `outputs` (dw, db
    where there are a weight and a bias): the fill of the partial slots, the split (one
    waiting launch, or its two steps apart), then the reductions of dw and db unless one lane
    wrote them."""
    m, n = x.shape
    lanes = _coop.lane_count(x, config)
    # One lane holds all of a column's rows: it writes dw and db itself, with no reduction.
    direct = lanes == 1
    partials = outputs if direct else [
        torch.empty((lanes, n), dtype=torch.float32, device=x.device) for _ in outputs]
    # A kernel argument that is never read where its flag is off: any tensor at hand.
    dw, dw_part = (outputs[0], partials[0]) if weight is not None else (x, x)
    db, db_part = (outputs[-1], partials[-1]) if bias is not None else (x, x)
    parts, launches = _coop_dependent.launches(
        _layernorm_bwd_split_kernel, x, config, 1, dy, x, weight, mean, rstd, dx, dw_part,
        db_part, dw, db, dy.stride(0), x.stride(0), dx.stride(0), m, n, pdl=pdl, values=2,
        DIRECT=direct, HAS_W=weight is not None, HAS_B=bias is not None, EVICT=config.EVICT)
    if not direct:
        launches += reductions(partials, outputs, sms, pdl)
    return Described((dx, *outputs), launches, (parts,))


def reductions(partials: list[torch.Tensor], outputs: list[torch.Tensor], sms: int, pdl: bool
               ) -> tuple[Launch, ...]:
    """The launches of `rmsnorm_bwd`'s reduction that sum each (G, N) fp32 partial buffer into
    its output (N,), cast once: dw's, then db's."""
    launches = []
    for partial, out in zip(partials, outputs, strict=True):
        grid, n = partial.shape
        programs, block_c, block_g, warps = reduce_launch(n, grid, sms)
        launches.append(Launch(_dw_reduce_kernel, (programs,), (partial, out, grid, n),
                               {"BLOCK_G": block_g, "BLOCK_C": block_c, "num_warps": warps,
                                "PDL": pdl, "launch_pdl": pdl}))
    return tuple(launches)


def layernorm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
    mean: torch.Tensor, rstd: torch.Tensor, config: BackwardConfig,
) -> tuple[torch.Tensor, ...]:
    """Run `describe_layernorm_bwd`: dx, then dw and db where there are a weight and a bias."""
    return run(describe_layernorm_bwd(dy, x, weight, bias, mean, rstd, config))
