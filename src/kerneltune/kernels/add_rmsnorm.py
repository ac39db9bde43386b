"""Fused residual add + RMSNorm forward: the new residual s = x + residual, then y = rmsnorm(s).

Maths (HF Llama RMSNorm applied to the rounded sum, as a pre-norm decoder layer does it)::

    s     = (x + residual in fp32).to(x.dtype)                   returned: the new residual
    r     = 1 / sqrt(mean(s², over N, in fp32) + eps)            s as rounded, upcast to fp32
    llama (offset = 0):  y = w · (s · r).to(x.dtype)             product in fp32, one cast
    gemma (offset ≠ 0):  y = (s · r · (offset + w)).to(x.dtype)  all in fp32, one cast
    rstd  = r (fp32, one per row)

One program normalises ROWS rows. SINGLE keeps a whole row block in registers (BLOCK_N ≥ N):
x and residual are read once, s and y written once. Otherwise the row is looped over in
BLOCK_N chunks twice: the first pass reads x and residual, writes s and accumulates the sum of
squares; the second pass re-reads s (written moments ago, so served by L2 when EVICT keeps it
there) to normalise. Reading s back costs one row instead of two (x and residual again).

A whole row in one block may run on a persistent grid instead (GRID_MULT > 1), as the
forward's may (`kerneltune.kernels.rmsnorm_fwd`): each program loads its weight once, with its
first rows rather than after their sum, and its next rows while it works on these.

COOP splits each row over cooperating programs, as the forward's split does; a row's chunks
agree once, on the sum of squares of s. On sm_90 and later the one-launch kernel is a
programmatic dependent launch, as the forward's is (`kerneltune.kernels._dependent_launch`);
the cooperative split is launched the ordinary way.

References: vLLM's ``fused_add_rms_norm`` (the same fusion, in place); the Triton layer-norm
tutorial (the row tiling).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kerneltune.kernels import _coop, _coop_norm, _dependent_launch
from kerneltune.kernels._config import RowTilingConfig
from kerneltune.kernels._coop import gather, lane_chunk, load_rows, publish
from kerneltune.kernels._coop_norm import lane_rstd
from kerneltune.kernels._dependent_launch import release_next_grid, wait_prior_grid
from kerneltune.kernels._launch import Described, Launch, run
from kerneltune.kernels._spec import (
    dependent_launch,
    interpreting,
    launch_options,
    row_block_grid,
)
from kerneltune.kernels.rmsnorm_fwd import refuse_unrunnable

#: Version of the launcher's grids, arguments, constexprs and launch options: part of the kernel
#: hash, raised whenever a host-side change alters what the GPU is asked to run.
LAUNCH_VERSION = 1
#: Shared Triton functions this module calls: hashed with it.
DEVICE_CODE_FROM = (_coop, _coop_norm, _dependent_launch)


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
    exact: the interpreter's fp32 -> bf16 cast truncates. Compiled kernels use the hardware
    conversion.
    """
    if SOFT_ROUND and tl.bfloat16 == DTYPE:  # keep 7 of fp32's 23 mantissa bits
        bits = v.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        v = bits.to(tl.float32, bitcast=True)
    return v.to(DTYPE)


@triton.jit
def _store_row_chunk(ptrs, value, mask, EVICT: tl.constexpr, POLICY: tl.constexpr):
    if EVICT:
        tl.store(ptrs, value, mask=mask, eviction_policy=POLICY)
    else:
        tl.store(ptrs, value, mask=mask)


@triton.jit
def _normalise(s, r, w, offset, GEMMA: tl.constexpr, DTYPE: tl.constexpr,
               SOFT_ROUND: tl.constexpr):
    """y in DTYPE from the fp32 row chunk s, its rstd r (ROWS,) and the fp32 weight chunk w."""
    shat = s * r[:, None]
    if GEMMA:
        return _cast(shat * (offset + w[None, :]), DTYPE, SOFT_ROUND)
    # HF Llama: x̂ rounded to the input dtype before the weight multiply
    return _cast(w[None, :] * _cast(shat, DTYPE, SOFT_ROUND).to(tl.float32), DTYPE, SOFT_ROUND)


@triton.jit
def _add_normalise_persistent(X, RES, W, Y, S, RSTD, stride_x, stride_res, stride_y, stride_s,
                              M, N, eps, offset, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
                              GEMMA: tl.constexpr, EVICT: tl.constexpr,
                              SOFT_ROUND: tl.constexpr, PDL: tl.constexpr):
    """PERSIST: the whole rows (one block) of row blocks pid, pid + P, ... (P programs), each
    program loading its next row block of x and residual while it works on this one, its
    weight in registers for all of them."""
    step = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    dtype = Y.dtype.element_ty
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    x_next = load_rows(X, tl.program_id(0), cols, col_ok, stride_x, M, ROWS, EVICT)
    res_next = load_rows(RES, tl.program_id(0), cols, col_ok, stride_res, M, ROWS, EVICT)
    blocks = tl.cdiv(M, ROWS)
    for rb in range(tl.program_id(0), blocks, step):
        x, res = x_next, res_next
        x_next = load_rows(X, rb + step, cols, col_ok, stride_x, M, ROWS, EVICT)
        res_next = load_rows(RES, rb + step, cols, col_ok, stride_res, M, ROWS, EVICT)
        if rb + step >= blocks:  # the last block: nothing left to load
            release_next_grid(PDL)
        rows = rb * ROWS + tl.arange(0, ROWS)
        row_ok = rows < M
        mask = row_ok[:, None] & col_ok[None, :]
        s = _cast(x.to(tl.float32) + res.to(tl.float32), dtype, SOFT_ROUND)
        tl.store(S + rows.to(tl.int64)[:, None] * stride_s + cols[None, :], s, mask=mask)
        s = s.to(tl.float32)
        r = tl.rsqrt(tl.sum(s * s, axis=1) / N + eps)
        tl.store(Y + rows.to(tl.int64)[:, None] * stride_y + cols[None, :],
                 _normalise(s, r, w, offset, GEMMA, dtype, SOFT_ROUND), mask=mask)
        tl.store(RSTD + rows, r, mask=row_ok)


@triton.jit
def _add_rmsnorm_fwd_kernel(
    X, RES, W, Y, S, RSTD,
    stride_x, stride_res, stride_y, stride_s, M, N,
    eps, offset,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, SINGLE: tl.constexpr,
    GEMMA: tl.constexpr, EVICT: tl.constexpr, SOFT_ROUND: tl.constexpr,
    PERSIST: tl.constexpr, PDL: tl.constexpr,
):
    wait_prior_grid(PDL)
    if PERSIST:
        _add_normalise_persistent(X, RES, W, Y, S, RSTD, stride_x, stride_res, stride_y,
                                  stride_s, M, N, eps, offset, BLOCK_N, ROWS, GEMMA, EVICT,
                                  SOFT_ROUND, PDL)
    else:
        _add_normalise(X, RES, W, Y, S, RSTD, stride_x, stride_res, stride_y, stride_s, M, N,
                       eps, offset, BLOCK_N, ROWS, SINGLE, GEMMA, EVICT, SOFT_ROUND, PDL)


@triton.jit
def _add_normalise(X, RES, W, Y, S, RSTD, stride_x, stride_res, stride_y, stride_s, M, N, eps,
                   offset, BLOCK_N: tl.constexpr, ROWS: tl.constexpr, SINGLE: tl.constexpr,
                   GEMMA: tl.constexpr, EVICT: tl.constexpr, SOFT_ROUND: tl.constexpr,
                   PDL: tl.constexpr):
    """One program per row block: the whole row (SINGLE) or two passes over its chunks."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < M
    rows = rows.to(tl.int64)
    x_rows = X + rows[:, None] * stride_x
    res_rows = RES + rows[:, None] * stride_res
    y_rows = Y + rows[:, None] * stride_y
    s_rows = S + rows[:, None] * stride_s
    dtype = Y.dtype.element_ty
    cols = tl.arange(0, BLOCK_N)
    if SINGLE:
        mask = row_ok[:, None] & (cols[None, :] < N)
        x = _load_row_chunk(x_rows + cols[None, :], mask, EVICT, "evict_first")
        res = _load_row_chunk(res_rows + cols[None, :], mask, EVICT, "evict_first")
        s = _cast(x + res, dtype, SOFT_ROUND)
        tl.store(s_rows + cols[None, :], s, mask=mask)
        s = s.to(tl.float32)
        r = tl.rsqrt(tl.sum(s * s, axis=1) / N + eps)
        w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)
        release_next_grid(PDL)
        y = _normalise(s, r, w, offset, GEMMA, dtype, SOFT_ROUND)
        tl.store(y_rows + cols[None, :], y, mask=mask)
    else:
        acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            mask = row_ok[:, None] & (c[None, :] < N)
            x = _load_row_chunk(x_rows + c[None, :], mask, EVICT, "evict_first")
            res = _load_row_chunk(res_rows + c[None, :], mask, EVICT, "evict_first")
            s = _cast(x + res, dtype, SOFT_ROUND)
            _store_row_chunk(s_rows + c[None, :], s, mask, EVICT, "evict_last")
            s = s.to(tl.float32)
            acc += s * s
        r = tl.rsqrt(tl.sum(acc, axis=1) / N + eps)
        # The second pass reads back what other threads of this program stored.
        tl.debug_barrier()
        for start in range(0, N, BLOCK_N):
            c = start + cols
            mask = row_ok[:, None] & (c[None, :] < N)
            s = _load_row_chunk(s_rows + c[None, :], mask, EVICT, "evict_first")
            w = tl.load(W + c, mask=c < N, other=0.0).to(tl.float32)
            y = _normalise(s, r, w, offset, GEMMA, dtype, SOFT_ROUND)
            tl.store(y_rows + c[None, :], y, mask=mask)
        release_next_grid(PDL)
    tl.store(RSTD + rows, r, mask=row_ok)


@triton.jit
def _add_rmsnorm_fwd_coop_kernel(
    PART, NQ, X, RES, W, Y, S, RSTD,
    stride_x, stride_res, stride_y, stride_s, M, N, eps, offset,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, NQ_POW2: tl.constexpr, PHASE: tl.constexpr,
    GEMMA: tl.constexpr, EVICT: tl.constexpr, SOFT_ROUND: tl.constexpr,
):
    """COOP (see `kerneltune.kernels._coop`) over NQ chunks: a row's chunks agree once, on the
    sum of squares of s (PART[row, q]). PHASE 0 does it all in one launch; PHASE 1 (s and the
    partial sums) and 2 (y) are its steps apart. Pipelined one row block deep, as the
    forward's split is (`kerneltune.kernels.rmsnorm_fwd`)."""
    lane, n_lanes, q, cols, col_ok = lane_chunk(NQ, N, BLOCK_N)
    dtype = Y.dtype.element_ty
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    s = _new_residual(load_rows(X, lane, cols, col_ok, stride_x, M, ROWS, EVICT),
                      load_rows(RES, lane, cols, col_ok, stride_res, M, ROWS, EVICT),
                      S, PART, lane, q, NQ, cols, col_ok, stride_s, M, ROWS, PHASE <= 1, SOFT_ROUND)
    x_next = load_rows(X, lane + n_lanes, cols, col_ok, stride_x, M, ROWS, EVICT)
    res_next = load_rows(RES, lane + n_lanes, cols, col_ok, stride_res, M, ROWS, EVICT)
    for rb in range(lane, tl.cdiv(M, ROWS), n_lanes):
        x_ahead, res_ahead = x_next, res_next
        x_next = load_rows(X, rb + 2 * n_lanes, cols, col_ok, stride_x, M, ROWS, EVICT)
        res_next = load_rows(RES, rb + 2 * n_lanes, cols, col_ok, stride_res, M, ROWS, EVICT)
        s_ahead = _new_residual(x_ahead, res_ahead, S, PART, rb + n_lanes, q, NQ, cols, col_ok,
                                stride_s, M, ROWS, PHASE <= 1, SOFT_ROUND)
        if PHASE != 1:
            rows = rb * ROWS + tl.arange(0, ROWS)
            row_ok = rows < M
            parts = gather(PART, rows, row_ok, NQ, NQ_POW2, PHASE == 0)
            r = lane_rstd(parts, RSTD, rows, row_ok, q, N, eps, NQ_POW2)
            y = _normalise(s, r, w, offset, GEMMA, dtype, SOFT_ROUND)
            tl.store(Y + rows.to(tl.int64)[:, None] * stride_y + cols[None, :], y,
                     mask=row_ok[:, None] & col_ok[None, :])
        s = s_ahead


@triton.jit
def _new_residual(x, res, S, PART, rb, q, NQ, cols, col_ok, stride_s, M, ROWS: tl.constexpr,
                  PUBLISH: tl.constexpr, SOFT_ROUND: tl.constexpr):
    """Row block `rb`'s chunk of s in fp32 from its chunks of x and residual as loaded; with
    PUBLISH, s is stored (rounded) and its partial sums of squares published."""
    s = _cast(x.to(tl.float32) + res.to(tl.float32), S.dtype.element_ty, SOFT_ROUND)
    if PUBLISH:
        rows = rb * ROWS + tl.arange(0, ROWS)
        tl.store(S + rows.to(tl.int64)[:, None] * stride_s + cols[None, :], s,
                 mask=(rows < M)[:, None] & col_ok[None, :])
    s = s.to(tl.float32)
    if PUBLISH:
        publish(PART, rb, q, NQ, M, tl.sum(s * s, axis=1), ROWS)
    return s


def describe_add_rmsnorm_fwd(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, offset: float,
    config: RowTilingConfig, pdl: bool | None = None,
) -> Described:
    """Add + norm on (M, N) views with unit stride along N (rows may be strided).

    Outputs y (M, N), the new residual s = x + residual (M, N), both in x's dtype, and
    rstd (M,) fp32. `pdl`: launch as a programmatic dependent launch (None: wherever the
    device has it). ValueError for a config no launch can run right
    (`kerneltune.kernels.rmsnorm_fwd.refuse_unrunnable`).
    """
    m, n = x.shape
    refuse_unrunnable(config, n, config.SINGLE and not config.COOP)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    new_residual = torch.empty((m, n), dtype=x.dtype, device=x.device)
    rstd = torch.empty((m,), dtype=torch.float32, device=x.device)
    outputs = (y, new_residual, rstd)
    if m == 0:
        return Described(outputs, ())
    args = (x, residual, weight, y, new_residual, rstd, x.stride(0), residual.stride(0),
            y.stride(0), new_residual.stride(0), m, n, eps, offset)
    if config.COOP:
        parts, launches = _coop.launches(
            _add_rmsnorm_fwd_coop_kernel, x, config, 1, *args,
            GEMMA=offset != 0.0, EVICT=config.EVICT, SOFT_ROUND=interpreting())
        return Described(outputs, launches, (parts,))
    persist = config.GRID_MULT > 1
    if persist and not config.SINGLE:
        raise ValueError(f"a persistent grid (GRID_MULT={config.GRID_MULT}) runs a whole row "
                         f"in one block, not {config}")
    pdl = dependent_launch(x.device) if pdl is None else pdl
    return Described(outputs, (Launch(
        _add_rmsnorm_fwd_kernel, (row_block_grid(m, config, x.device),), args,
        {"BLOCK_N": config.BLOCK_N, "ROWS": config.ROWS, "SINGLE": config.SINGLE,
         "GEMMA": offset != 0.0, "EVICT": config.EVICT, "SOFT_ROUND": interpreting(),
         "PERSIST": persist, "PDL": pdl, "launch_pdl": pdl, **launch_options(config),
         **_coop.resident_options(config)}),))


def add_rmsnorm_fwd(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, offset: float,
    config: RowTilingConfig, pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run `describe_add_rmsnorm_fwd`: y, the new residual and rstd."""
    return run(describe_add_rmsnorm_fwd(x, residual, weight, eps, offset, config, pdl))
