"""LayerNorm forward: the Triton layer-norm tutorial's semantics, its kernel and launcher (the
backward's are in `kerneltune.kernels.layernorm_bwd`).

Maths (everything in fp32, one cast of each output)::

    mean = Σ_N x / N
    var  = Σ_N (x − mean)² / N                     biased, as torch's layer norm
    rstd = 1 / sqrt(var + eps)
    x̂    = (x − mean) · rstd
    y    = x̂ · w + b                               w = 1 and b = 0 where absent
    saved for backward: mean, rstd (fp32, one per row)

Design: a grid of programs each normalising row blocks of ROWS rows: one per program, or on a
persistent grid (GRID_MULT > 1, `row_block_grid`) every P-th. SINGLE keeps the row block in
registers (one read of x); otherwise two passes over BLOCK_N chunks: the mean and the centred
sum of squares together (each chunk's from registers, merged into the row's as in Chan, Golub
and LeVeque's parallel variance, of x less the row's first element), then the output, the
re-read served by L2 when EVICT keeps the row there. On sm_90 and later the launch is a
programmatic dependent launch (`kerneltune.kernels._dependent_launch`).

Device code: the forward's kernel hash is this module's, with the modules it names in
`DEVICE_CODE_FROM`; the backward's kernels live in `layernorm_bwd`, so that an edit to either
direction leaves the other's tuned entries current.

References: the Triton layer-norm tutorial; Liger's ``layer_norm``; T. F. Chan, G. H. Golub,
R. J. LeVeque, "Updating formulae and a pairwise algorithm for computing sample variances"
(1979).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kerneltune.kernels import _coop, _dependent_launch, _layernorm_loads
from kerneltune.kernels._config import BackwardConfig, RowTilingConfig
from kerneltune.kernels._dependent_launch import release_next_grid, wait_prior_grid
from kerneltune.kernels._launch import Described, Launch, run
from kerneltune.kernels._layernorm_loads import column_vector, load_f32
from kerneltune.kernels._spec import dependent_launch, launch_options, row_block_grid
from kerneltune.kernels.rmsnorm_fwd import refuse_unrunnable

#: Version of the forward launcher's grids, arguments, constexprs and launch options: part of its
#: kernel hash, raised whenever a host-side change alters what the GPU is asked to run.
LAUNCH_VERSION = 1
#: Triton functions from other modules that the forward calls: hashed with it.
DEVICE_CODE_FROM = (_dependent_launch, _layernorm_loads)


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
            x = load_f32(x_rows + cols[None, :], mask, READ_ONCE)
            mean = tl.sum(x, axis=1) / N
            xc = tl.where(mask, x - mean[:, None], 0.0)
            rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / N + eps)
            # w and b loaded where used, not held in registers across the sums.
            w = column_vector(W, cols, col_ok, HAS_W, 1.0)
            b = column_vector(B, cols, col_ok, HAS_B, 0.0)
            y = xc * rstd[:, None] * w[None, :] + b[None, :]
            tl.store(y_rows + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
        else:
            # One pass for both statistics: each chunk's mean and centred sum of squares (two
            # passes over registers), merged into the row's as Chan et al. do. Taken of
            # x − (the row's first element), so that the merge's differences of means stay
            # small where x sits far from zero.
            shift = tl.load(X + rows64 * stride_x, mask=row_ok, other=0.0).to(tl.float32)
            mean = tl.zeros([ROWS], dtype=tl.float32)
            m2 = tl.zeros([ROWS], dtype=tl.float32)
            for start in range(0, N, BLOCK_N):
                c = start + cols
                mask = row_ok[:, None] & (c < N)[None, :]
                x = load_f32(x_rows + c[None, :], mask, READ_AGAIN) - shift[:, None]
                seen = start * 1.0  # as fp32 (the interpreter's loop index is an int)
                count = tl.minimum(N - start, BLOCK_N) * 1.0
                chunk_mean = tl.sum(tl.where(mask, x, 0.0), axis=1) / count
                xc = tl.where(mask, x - chunk_mean[:, None], 0.0)
                delta = chunk_mean - mean
                mean += delta * (count / (seen + count))
                m2 += tl.sum(xc * xc, axis=1) + delta * delta * (seen * count / (seen + count))
            mean += shift
            rstd = 1.0 / tl.sqrt(m2 / N + eps)
            for start in range(0, N, BLOCK_N):
                c = start + cols
                c_ok = c < N
                mask = row_ok[:, None] & c_ok[None, :]
                x = load_f32(x_rows + c[None, :], mask, READ_ONCE)
                w = column_vector(W, c, c_ok, HAS_W, 1.0)
                b = column_vector(B, c, c_ok, HAS_B, 0.0)
                y = (x - mean[:, None]) * rstd[:, None] * w[None, :] + b[None, :]
                tl.store(y_rows + c[None, :], y.to(Y.dtype.element_ty), mask=mask)
        tl.store(MEAN + rows, mean, mask=row_ok)
        tl.store(RSTD + rows, rstd, mask=row_ok)
    release_next_grid(PDL)


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
