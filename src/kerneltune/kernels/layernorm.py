"""LayerNorm forward and backward: the Triton layer-norm tutorial's semantics; the forward's
launcher (the backward's is in `kerneltune.kernels.layernorm_bwd`).

Maths (everything in fp32, one cast of each output)::

    mean = Σ_N x / N
    var  = Σ_N (x − mean)² / N                     biased, as torch's layer norm
    rstd = 1 / sqrt(var + eps)
    x̂    = (x − mean) · rstd
    y    = x̂ · w + b                               w = 1 and b = 0 where absent
    saved for backward: mean, rstd (fp32, one per row)

    backward, from dy and the saved mean and rstd:
    c1 = Σ_N x̂ · (w · dy) / N,    c2 = Σ_N w · dy / N
    dx = (w · dy − (x̂ · c1 + c2)) · rstd
    dw = Σ_rows dy · x̂,   db = Σ_rows dy            accumulated in fp32

Forward design: a grid of programs each normalising row blocks of ROWS rows: one per program,
or on a persistent grid (GRID_MULT > 1, `row_block_grid`) every P-th. SINGLE keeps the row
block in registers (one read of x); otherwise three passes over BLOCK_N chunks (the sum, the
centred sum of squares, the output), the re-reads served by L2 when EVICT keeps the row there.

Backward design, as `kerneltune.kernels.rmsnorm_bwd`'s: a persistent grid of
GRID = min(GRID_MULT · SMs, ⌈M / ROWS⌉) programs, program p taking row blocks p, p + GRID, …
and keeping fp32 partials of dw and db, in registers beside a whole row (DW = "registers") or
in its private row of a (GRID, N) buffer (DW = "global"; also the looped case: two passes, c1
and c2, then dx and the partials). Plain load-add-store: no other program touches the row,
and the first row block stores, so the buffers need no zeroing. The partials are summed by
`rmsnorm_bwd`'s reduction kernel (`reduce_launch`), one launch for dw and one for db. Or the
rows split over cooperating programs (DW = "split"), whose kernel is in `layernorm_bwd`.

On sm_90 and later each launch is a programmatic dependent launch
(`kerneltune.kernels._dependent_launch`).

Device code: the forward's kernel hash is this module's (with `DEVICE_CODE_FROM`), the
backward's `layernorm_bwd`'s, which names this module among its own: an edit to a Triton
function here makes both stale, an edit to the split's only the backward's. (The whole rows'
and looped backward kernels, hashed with the forward's since they were written, stay here.)

References: the Triton layer-norm tutorial (the passes, the partial sums of dw and db);
Liger's ``layer_norm``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kerneltune.kernels import _coop, _dependent_launch, rmsnorm_bwd
from kerneltune.kernels._config import BackwardConfig, RowTilingConfig
from kerneltune.kernels._dependent_launch import release_next_grid, wait_prior_grid
from kerneltune.kernels._launch import Described, Launch, run
from kerneltune.kernels._spec import dependent_launch, launch_options, row_block_grid
from kerneltune.kernels.rmsnorm_fwd import refuse_unrunnable

#: Version of the forward launcher's grids, arguments, constexprs and launch options: part of its
#: kernel hash, raised whenever a host-side change alters what the GPU is asked to run. (The
#: backward's launches are versioned by `layernorm_bwd`.)
LAUNCH_VERSION = 1
#: Triton functions from other modules hashed with this one's: those the forward calls, and the
#: backward's dw and db reduction (`rmsnorm_bwd`'s), which `layernorm_bwd` launches beside the
#: kernels here.
DEVICE_CODE_FROM = (_dependent_launch, rmsnorm_bwd)


@triton.jit
def _load_f32(ptrs, mask, POLICY: tl.constexpr):
    """A block as fp32, zero where masked, with an eviction hint (none: "")."""
    return tl.load(ptrs, mask=mask, other=0.0, eviction_policy=POLICY).to(tl.float32)


@triton.jit
def _column_vector(P, c, c_ok, HAS: tl.constexpr, ABSENT: tl.constexpr):
    """P over the columns `c` in fp32 (zero past N); ABSENT where there is no P (w = 1, b = 0)."""
    if HAS:
        v = tl.load(P + c, mask=c_ok, other=0.0).to(tl.float32)
    else:
        v = tl.where(c_ok, ABSENT, 0.0)
    return v


@triton.jit
def _layernorm_fwd_kernel(
    X, W, B, Y, MEAN, RSTD,
    stride_x, stride_y, M, N, eps,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, SINGLE: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, READ_ONCE: tl.constexpr,
    READ_AGAIN: tl.constexpr, PDL: tl.constexpr,
):
    wait_prior_grid(PDL)
    cols = tl.arange(0, BLOCK_N)
    for rb in range(tl.program_id(0), tl.cdiv(M, ROWS), tl.num_programs(0)):
        rows = rb * ROWS + tl.arange(0, ROWS)
        row_ok = rows < M
        rows64 = rows.to(tl.int64)
        x_rows = X + rows64[:, None] * stride_x
        y_rows = Y + rows64[:, None] * stride_y
        if SINGLE:
            col_ok = cols < N
            mask = row_ok[:, None] & col_ok[None, :]
            x = _load_f32(x_rows + cols[None, :], mask, READ_ONCE)
            mean = tl.sum(x, axis=1) / N
            xc = tl.where(mask, x - mean[:, None], 0.0)
            rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / N + eps)
            # w and b loaded where used, not held in registers across the sums.
            w = _column_vector(W, cols, col_ok, HAS_W, 1.0)
            b = _column_vector(B, cols, col_ok, HAS_B, 0.0)
            y = xc * rstd[:, None] * w[None, :] + b[None, :]
            tl.store(y_rows + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
        else:
            acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
            for start in range(0, N, BLOCK_N):
                c = start + cols
                acc += _load_f32(x_rows + c[None, :], row_ok[:, None] & (c < N)[None, :],
                                 READ_AGAIN)
            mean = tl.sum(acc, axis=1) / N
            acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
            for start in range(0, N, BLOCK_N):
                c = start + cols
                mask = row_ok[:, None] & (c < N)[None, :]
                x = _load_f32(x_rows + c[None, :], mask, READ_AGAIN)
                xc = tl.where(mask, x - mean[:, None], 0.0)
                acc += xc * xc
            rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=1) / N + eps)
            for start in range(0, N, BLOCK_N):
                c = start + cols
                c_ok = c < N
                mask = row_ok[:, None] & c_ok[None, :]
                x = _load_f32(x_rows + c[None, :], mask, READ_ONCE)
                w = _column_vector(W, c, c_ok, HAS_W, 1.0)
                b = _column_vector(B, c, c_ok, HAS_B, 0.0)
                y = (x - mean[:, None]) * rstd[:, None] * w[None, :] + b[None, :]
                tl.store(y_rows + c[None, :], y.to(Y.dtype.element_ty), mask=mask)
        tl.store(MEAN + rows, mean, mask=row_ok)
        tl.store(RSTD + rows, rstd, mask=row_ok)
    release_next_grid(PDL)


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
        w = _column_vector(W, cols, cols < N, HAS_W, 1.0)
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
            x = _load_f32(x_rows + cols[None, :], mask, READ_ONCE)
            dy = _load_f32(dy_rows + cols[None, :], mask, READ_ONCE)
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
                x = _load_f32(x_rows + c[None, :], mask, READ_TWICE)
                dy = _load_f32(dy_rows + c[None, :], mask, READ_TWICE)
                wdy = dy * _column_vector(W, c, c_ok, HAS_W, 1.0)[None, :]
                s1 += (x - mean[:, None]) * rstd[:, None] * wdy
                s2 += wdy
            c1 = tl.sum(s1, axis=1) / N
            c2 = tl.sum(s2, axis=1) / N
            # Pass 2: dx, and dw and db into the program's partial rows.
            for start in range(0, N, BLOCK_N):
                c = start + cols
                c_ok = c < N
                mask = row_ok[:, None] & c_ok[None, :]
                x = _load_f32(x_rows + c[None, :], mask, READ_ONCE)
                dy = _load_f32(dy_rows + c[None, :], mask, READ_ONCE)
                xhat = (x - mean[:, None]) * rstd[:, None]
                wdy = dy * _column_vector(W, c, c_ok, HAS_W, 1.0)[None, :]
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


def _eviction(config: RowTilingConfig | BackwardConfig) -> tuple[str, str]:
    """The hints of a block read once and of one read again (EVICT), or none."""
    return ("evict_first", "evict_last") if config.EVICT else ("", "")


def describe_layernorm_fwd(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
    config: RowTilingConfig, pdl: bool | None = None,
) -> Described:
    """The forward on a (M, N) view with unit stride along N (rows may be strided): outputs y
    (M, N) in x.dtype, mean and rstd (M,) fp32. `weight` and `bias` (N,) may each be None.

    `pdl`: launch as a programmatic dependent launch (None: wherever the device has it).
    ValueError for a config no launch can run right (`refuse_unrunnable`, a row split)."""
    m, n = x.shape
    if config.COOP:
        raise ValueError(f"cannot launch {config!r}: the layer norm splits no row (COOP)")
    refuse_unrunnable(config, n, bool(config.SINGLE))
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    mean = torch.empty((m,), dtype=torch.float32, device=x.device)
    rstd = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m == 0:
        return Described((y, mean, rstd), ())
    pdl = dependent_launch(x.device) if pdl is None else pdl
    read_once, read_again = _eviction(config)
    return Described((y, mean, rstd), (Launch(
        _layernorm_fwd_kernel, (row_block_grid(m, config, x.device),),
        (x, weight, bias, y, mean, rstd, x.stride(0), y.stride(0), m, n, eps),
        {"BLOCK_N": config.BLOCK_N, "ROWS": config.ROWS, "SINGLE": bool(config.SINGLE),
         "HAS_W": weight is not None, "HAS_B": bias is not None, "READ_ONCE": read_once,
         "READ_AGAIN": read_again, "PDL": pdl, "launch_pdl": pdl,
         **launch_options(config), **_coop.resident_options(config)}),))


def layernorm_fwd(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
    config: RowTilingConfig, pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run `describe_layernorm_fwd`: y (M, N), mean and rstd (M,) fp32."""
    return run(describe_layernorm_fwd(x, weight, bias, eps, config, pdl))
