"""RMSNorm forward fused with per-token-group dynamic quantisation (fp8 e4m3 or int8), with an
optional residual added first.

Per row of N elements, per group of G = `group_size` consecutive columns (G a power of two,
N a multiple of G; or one group of the whole row, G = N: per-token)::

    s = (x + residual in fp32).to(x.dtype)             with a residual: returned, the new
                                                       residual; x below is s
    r = 1 / sqrt(mean(x², over N, in fp32) + eps)
    y = (w · (x · r).to(x.dtype)).to(x.dtype)          products in fp32 (llama mode)
    fp8:   s_g = max(max_g|y| / 448, 1 / (448 · 512))
           q   = e4m3fn(clamp(y · (1/s_g), -448, 448))  the cast rounds to nearest even
    int8:  s_g = max(max_g|y| / 127, 2^-23)            the per-token mode's floor
           q   = int8(clamp(rne(y · (1/s_g)), -128, 127))
    UE8M0: s_g = 2^ceil(log2 s_g)                      a power of two, 1/s_g exact
    returns q (M, N), scales (M, N / G) fp32 (strides (N / G, 1), or (1, M) column-major),
    and with a residual the new residual (M, N): y ≈ q · s_g

The scales and the rounding are `kerneltune.kernels.rmsnorm_quant`'s (its `_normed`,
`_row_scale`, `_quantise` run here, per group instead of per row), so G = N gives exactly its
per-token q and scale.

Design: a program takes ROWS rows, or on a persistent grid (GRID_MULT > 1) every P-th block of
ROWS rows. SINGLE holds the whole row block in registers; its groups are the row block
reshaped to (ROWS · BLOCK_N / G, G), each group's max a row reduction. Looped: chunks of
BLOCK_N ≥ 512 ≥ G hold whole groups, so two passes do (the sum of squares, with the residual's
sum stored; then y, quantised chunk by chunk), and three for one group a row (its max needs a
pass of its own). With a residual, the later passes read back the stored sum (one row instead
of two), kept in L2 by EVICT as x is.

References: vLLM's ``rms_norm_per_block_quant`` and ``per_token_group_quant_fp8`` (the group
scales, UE8M0 and column-major scales of DeepGEMM); vLLM's ``fused_add_rms_norm`` (the residual
fusion); the Triton layer-norm tutorial (the row tiling).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kerneltune.kernels import _coop, _dependent_launch, rmsnorm_quant
from kerneltune.kernels._config import RowTilingConfig
from kerneltune.kernels._dependent_launch import release_next_grid, wait_prior_grid
from kerneltune.kernels._launch import Described, Launch, run
from kerneltune.kernels._spec import (
    dependent_launch,
    interpreting,
    launch_options,
    row_block_grid,
)
from kerneltune.kernels.rmsnorm_fwd import refuse_unrunnable
from kerneltune.kernels.rmsnorm_quant import (
    MODES,
    _affine,
    _cast,
    _load_row_chunk,
    _normed,
    _quantise,
    _row_scale,
    quant_dtype,
)

#: Version of the launcher's grids, arguments, constexprs and launch options: part of the kernel
#: hash, raised whenever a host-side change alters what the GPU is asked to run.
LAUNCH_VERSION = 1
#: Triton functions this module calls from other modules: hashed with it.
DEVICE_CODE_FROM = (_dependent_launch, rmsnorm_quant)

GROUP_QUANT_MODES = ("fp8", "int8")
#: The group sizes a row may be cut into (powers of two).
GROUP_SIZES = (32, 64, 128, 256)


@triton.jit
def _store_chunk(ptrs, value, mask, EVICT: tl.constexpr, POLICY: tl.constexpr):
    if EVICT:
        tl.store(ptrs, value, mask=mask, eviction_policy=POLICY)
    else:
        tl.store(ptrs, value, mask=mask)


@triton.jit
def _input_chunk(X, RES, RES_OUT, rows64, c, mask, stride_x, stride_r, stride_o,
                 HAS_RES: tl.constexpr, EVICT: tl.constexpr, POLICY: tl.constexpr,
                 SOFT_ROUND: tl.constexpr):
    """The fp32 chunk to normalise at columns c: x, or with HAS_RES the sum x + residual
    rounded to x's dtype, which is stored as the new residual."""
    x = _load_row_chunk(X + rows64[:, None] * stride_x + c[None, :], mask, EVICT, POLICY)
    if HAS_RES:
        res = _load_row_chunk(RES + rows64[:, None] * stride_r + c[None, :], mask, EVICT,
                              POLICY)
        s = _cast(x + res, X.dtype.element_ty, SOFT_ROUND)
        _store_chunk(RES_OUT + rows64[:, None] * stride_o + c[None, :], s, mask, EVICT,
                     "evict_last")
        x = s.to(tl.float32)
    return x


@triton.jit
def _group_scale(amax, min_scale, MODE: tl.constexpr, QMAX: tl.constexpr,
                 UE8M0: tl.constexpr):
    """(the stored scale, the factor y is multiplied by) of groups whose max|y| is amax; with
    UE8M0 the scale rounded up to a power of two (the exponent carried where any mantissa bit
    is set: exact, no libdevice)."""
    s, mul = _row_scale(amax, 0.0, min_scale, MODE, QMAX)
    if UE8M0:
        bits = s.to(tl.uint32, bitcast=True)
        s = ((bits + 0x7FFFFF) & 0x7F800000).to(tl.float32, bitcast=True)
        mul = tl.math.div_rn(1.0, s)
    return s, mul


@triton.jit
def _quantise_groups(y, S, rows64, row_ok, g0, stride_sr, stride_sg, n_groups, min_scale,
                     ROWS: tl.constexpr, BLOCK: tl.constexpr, GROUP: tl.constexpr,
                     MODE: tl.constexpr, QMAX: tl.constexpr, UE8M0: tl.constexpr,
                     QTYPE: tl.constexpr, SOFT_ROUND: tl.constexpr):
    """q of the (ROWS, BLOCK) chunk y, whose columns are whole groups from group g0; the
    groups' scales stored (those from n_groups on are padding)."""
    NG: tl.constexpr = BLOCK // GROUP
    groups = tl.reshape(y, (ROWS * NG, GROUP))
    scale, mul = _group_scale(tl.max(tl.abs(groups), axis=1), min_scale, MODE, QMAX, UE8M0)
    q = _quantise(groups, mul, scale, MODE, QMAX, QTYPE, SOFT_ROUND)
    g = g0 + tl.arange(0, NG)
    ptrs = S + rows64[:, None] * stride_sr + g.to(tl.int64)[None, :] * stride_sg
    tl.store(ptrs, tl.reshape(scale, (ROWS, NG)),
             mask=row_ok[:, None] & (g < n_groups)[None, :])
    return tl.reshape(q, (ROWS, BLOCK))


@triton.jit
def _rmsnorm_group_quant_kernel(
    X, RES, RES_OUT, W, Q, S,
    stride_x, stride_r, stride_o, stride_q, stride_sr, stride_sg, M, N, n_groups, eps,
    min_scale,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, SINGLE: tl.constexpr, GROUP: tl.constexpr,
    PER_ROW: tl.constexpr, HAS_RES: tl.constexpr, EVICT: tl.constexpr, MODE: tl.constexpr,
    QMAX: tl.constexpr, UE8M0: tl.constexpr, SOFT_ROUND: tl.constexpr, PDL: tl.constexpr,
):
    """GROUP: the group's columns (BLOCK_N for one group a whole row held in registers);
    PER_ROW: one group a row (a looped row takes a pass for its max)."""
    wait_prior_grid(PDL)
    dtype = X.dtype.element_ty
    qtype = Q.dtype.element_ty
    cols = tl.arange(0, BLOCK_N)
    # With a residual the later passes read the stored sum back, of the same thread's stores.
    Y = RES_OUT if HAS_RES else X
    stride_y = stride_o if HAS_RES else stride_x
    for rb in range(tl.program_id(0), tl.cdiv(M, ROWS), tl.num_programs(0)):
        rows = rb * ROWS + tl.arange(0, ROWS)
        row_ok = rows < M
        rows64 = rows.to(tl.int64)
        q_rows = Q + rows64[:, None] * stride_q
        if SINGLE:
            mask = row_ok[:, None] & (cols < N)[None, :]
            x = _input_chunk(X, RES, RES_OUT, rows64, cols, mask, stride_x, stride_r,
                             stride_o, HAS_RES, EVICT, "evict_first", SOFT_ROUND)
            r = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
            w, _b = _affine(W, W, cols, N, True, False)
            y = _normed(x, r, w, w, MODE, True, False, dtype, SOFT_ROUND)
            q = _quantise_groups(y, S, rows64, row_ok, 0, stride_sr, stride_sg, n_groups,
                                 min_scale, ROWS, BLOCK_N, GROUP, MODE, QMAX, UE8M0, qtype,
                                 SOFT_ROUND)
            tl.store(q_rows + cols[None, :], q, mask=mask)
        else:
            acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
            for start in range(0, N, BLOCK_N):
                c = start + cols
                mask = row_ok[:, None] & (c < N)[None, :]
                x = _input_chunk(X, RES, RES_OUT, rows64, c, mask, stride_x, stride_r,
                                 stride_o, HAS_RES, EVICT, "evict_last", SOFT_ROUND)
                acc += x * x
            r = tl.rsqrt(tl.sum(acc, axis=1) / N + eps)
            if HAS_RES:
                tl.debug_barrier()
            y_rows = Y + rows64[:, None] * stride_y
            if PER_ROW:
                amax = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
                for start in range(0, N, BLOCK_N):
                    c = start + cols
                    mask = row_ok[:, None] & (c < N)[None, :]
                    x = _load_row_chunk(y_rows + c[None, :], mask, EVICT, "evict_last")
                    w, _b = _affine(W, W, c, N, True, False)
                    y = _normed(x, r, w, w, MODE, True, False, dtype, SOFT_ROUND)
                    amax = tl.maximum(amax, tl.abs(y))
                scale, mul = _group_scale(tl.max(amax, axis=1), min_scale, MODE, QMAX, UE8M0)
                for start in range(0, N, BLOCK_N):
                    c = start + cols
                    mask = row_ok[:, None] & (c < N)[None, :]
                    x = _load_row_chunk(y_rows + c[None, :], mask, EVICT, "evict_first")
                    w, _b = _affine(W, W, c, N, True, False)
                    y = _normed(x, r, w, w, MODE, True, False, dtype, SOFT_ROUND)
                    q = _quantise(y, mul, scale, MODE, QMAX, qtype, SOFT_ROUND)
                    tl.store(q_rows + c[None, :], q, mask=mask)
                tl.store(S + rows64 * stride_sr, scale, mask=row_ok)
            else:
                for start in range(0, N, BLOCK_N):
                    c = start + cols
                    mask = row_ok[:, None] & (c < N)[None, :]
                    x = _load_row_chunk(y_rows + c[None, :], mask, EVICT, "evict_first")
                    w, _b = _affine(W, W, c, N, True, False)
                    y = _normed(x, r, w, w, MODE, True, False, dtype, SOFT_ROUND)
                    q = _quantise_groups(y, S, rows64, row_ok, start // GROUP, stride_sr,
                                         stride_sg, n_groups, min_scale, ROWS, BLOCK_N, GROUP,
                                         MODE, QMAX, UE8M0, qtype, SOFT_ROUND)
                    tl.store(q_rows + c[None, :], q, mask=mask)
    release_next_grid(PDL)


def check_group_size(group_size: int | None, n: int) -> int | None:
    """`group_size` if it is one of `GROUP_SIZES` dividing n, None (one group a row) as it
    is; ValueError otherwise."""
    if group_size is None:
        return None
    if type(group_size) is not int or group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES} (or None: one group a row), "
                         f"got {group_size!r}")
    if n % group_size:
        raise ValueError(f"the hidden size {n} is not a multiple of group_size={group_size}")
    return group_size


def describe_rmsnorm_group_quant_fwd(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
    quant: str, group_size: int | None, scale_ue8m0: bool, column_major_scales: bool,
    config: RowTilingConfig, pdl: bool | None = None,
) -> Described:
    """Group quant on a (M, N) view with unit stride along N (rows may be strided; the
    residual's too). `group_size` None: one group a row (per-token).

    Returns q (M, N) (float8_e4m3fn or int8), the scales (M, N / group_size) fp32, column-major
    (strides (1, M)) with `column_major_scales`, and with a residual the new residual (M, N)
    in x's dtype. `pdl`: launch as a programmatic dependent launch (None: wherever the device
    has it). ValueError for a config no launch can run right (`refuse_unrunnable`, a row
    split), a quant mode or group size the kernel has not."""
    if quant not in GROUP_QUANT_MODES:
        raise ValueError(f"quant must be one of {GROUP_QUANT_MODES}, got {quant!r}")
    if config.COOP:
        raise ValueError(f"cannot launch {config!r}: group quant splits no row (COOP)")
    m, n = x.shape
    group = check_group_size(group_size, n)
    refuse_unrunnable(config, n, bool(config.SINGLE))
    if group is not None and config.BLOCK_N < group:
        raise ValueError(f"cannot launch {config!r}: a chunk of BLOCK_N={config.BLOCK_N} holds "
                         f"no whole group of {group}")
    groups = 1 if group is None else n // group
    q = torch.empty((m, n), dtype=quant_dtype(quant, x.dtype), device=x.device)
    if column_major_scales:
        scales = torch.empty((groups, m), dtype=torch.float32, device=x.device).t()
    else:
        scales = torch.empty((m, groups), dtype=torch.float32, device=x.device)
    new_res = None if residual is None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    outputs = (q, scales) if new_res is None else (q, scales, new_res)
    if m == 0:
        return Described(outputs, ())
    mode, qmax, min_scale = MODES[quant]
    res, res_out = (x, x) if residual is None else (residual, new_res)
    pdl = dependent_launch(x.device) if pdl is None else pdl
    return Described(outputs, (Launch(
        _rmsnorm_group_quant_kernel, (row_block_grid(m, config, x.device),),
        (x, res, res_out, weight, q, scales, x.stride(0), res.stride(0), res_out.stride(0),
         q.stride(0), scales.stride(0), scales.stride(1), m, n, groups, eps, min_scale),
        {"BLOCK_N": config.BLOCK_N, "ROWS": config.ROWS, "SINGLE": bool(config.SINGLE),
         "GROUP": config.BLOCK_N if group is None else group, "PER_ROW": group is None,
         "HAS_RES": residual is not None, "EVICT": config.EVICT, "MODE": mode, "QMAX": qmax,
         "UE8M0": bool(scale_ue8m0), "SOFT_ROUND": interpreting(), "PDL": pdl,
         "launch_pdl": pdl, **launch_options(config), **_coop.resident_options(config)}),))


def rmsnorm_group_quant_fwd(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
    quant: str, group_size: int | None, scale_ue8m0: bool, column_major_scales: bool,
    config: RowTilingConfig, pdl: bool | None = None,
) -> tuple[torch.Tensor, ...]:
    """Run `describe_rmsnorm_group_quant_fwd`: q, the scales, and the new residual where a
    residual was given."""
    return run(describe_rmsnorm_group_quant_fwd(x, residual, weight, eps, quant, group_size,
                                                scale_ue8m0, column_major_scales, config, pdl))
