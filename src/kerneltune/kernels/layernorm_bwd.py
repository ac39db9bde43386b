"""LayerNorm backward: the launcher of every DW mode, and the row split's kernel (DW = "split").

The whole rows' and looped kernels (DW = "registers", "global") are in
`kerneltune.kernels.layernorm`, whose docstring gives the maths and their design. The split
takes each row over ⌈N / BLOCK_N⌉ cooperating programs (`kerneltune.kernels._coop`), as
`kerneltune.kernels.rmsnorm_bwd`'s split does. Everything in fp32; chunk q of a row publishes
two partials, and every program of the row sums all of them in the same fixed order::

    s1_q = Σ_q (x − mean) · (w · dy),   s2_q = Σ_q w · dy      over chunk q's columns
    c1 = rstd · Σ_Q s1_q / N             = Σ_N x̂ · (w · dy) / N
    c2 = Σ_Q s2_q / N                    = Σ_N w · dy / N
    dx = (w · dy − (x̂ · c1 + c2)) · rstd
    dw = Σ_rows dy · x̂,   db = Σ_rows dy

x and dy are read once and stay in registers beside the lane's dw and db partials (w is read
where used, `_times_w`), so a long row moves no more than its bytes, and a few long rows still
use every SM. The rows agree once, on both sums: the two partials go out in one step, into two
buffers (`_coop_dependent.launches` with values = 2), and come back in one wait
(`gather_pair`). A lane's partials of dw and db are stored once into its rows of two
(lanes, N) fp32 buffers and summed by `rmsnorm_bwd`'s reduction (`reductions`); a grid of one
lane writes dw and db itself (DIRECT), in one launch. On sm_90 and later every launch is a
programmatic dependent launch (`kerneltune.kernels._dependent_launch`).

Device code: the backward's kernel hash is this module's (`LayerNormBwd.kernel_module`), with
the modules whose Triton functions it launches or calls (`DEVICE_CODE_FROM`): `layernorm` (the
whole rows' and looped kernels), `rmsnorm_bwd` (the reduction, the dw store) and the split's
shared code. The forward's hash is `layernorm`'s, so the split's kernel lives here: there, it
would have made every tuned forward entry stale.
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
    layernorm,
    rmsnorm_bwd,
)
from kerneltune.kernels._config import BackwardConfig
from kerneltune.kernels._coop import lane_chunk, load_rows, publish
from kerneltune.kernels._coop_pair import gather_pair
from kerneltune.kernels._dependent_launch import release_next_grid, wait_prior_grid
from kerneltune.kernels._launch import Described, Launch, run
from kerneltune.kernels._spec import dependent_launch, launch_options, sm_count
from kerneltune.kernels.layernorm import _dx, _eviction, _layernorm_bwd_kernel
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
DEVICE_CODE_FROM = (layernorm, rmsnorm_bwd, _coop, _coop_dependent, _coop_pair,
                    _dependent_launch)

#: Where the dw and db partials live (`layernorm`'s docstring, and the split above); a config
#: naming another is refused.
DW_MODES = ("registers", "global", "split")


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
