"""RMSNorm with per-token-group quantisation for model code: `rms_norm_group_quant`, and
`add_rms_norm_quant`, the residual-fused form (per token or per group).

Over the last dimension, llama-mode RMSNorm ``y = w · (x · r).to(x.dtype)``,
``r = rsqrt(mean(x², fp32) + eps)``, then per group of `group_size` columns (or per row)::

    fp8:   s = max(max|y| / 448, 1 / (448 · 512)),   q = e4m3(clamp(y / s, ±448))
    int8:  s = max(max|y| / 127, 2^-23),             q = round_half_even(y / s) in [-128, 127]
    scale_ue8m0: s rounded up to a power of two

(the kernels of `kerneltune.kernels.rmsnorm_group_quant`). With a residual, ``x + residual``
rounded to x's dtype is normalised and returned as the new residual. Per token (one group a
row) the scales are `kerneltune.rms_norm_quant`'s.

As the other public functions: each call's config is resolved once per kernel, N, dtype and M
bucket (`config_for`; `rmsnorm_group_quant_fwd` or `add_rmsnorm_group_quant_fwd`); eager calls
launch through the runtime's fast launch (`launch.Kernel`) and are then bound to their call key
(`launch.bind`: a later call like it allocates and launches, with no checks or description in
between); `torch.compile` traces the custom op ``kerneltune::rms_norm_group_quant`` (fake
implementation registered). Where the kernels cannot run (no CUDA, no interpreter) the torch
formula runs in fp32, with one warning. Not differentiable.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from kerneltune.kernels import rmsnorm_group_quant_spec
from kerneltune.kernels._spec import (
    as_rows,
    check_activation,
    check_eps,
    check_like,
    check_weight,
)
from kerneltune.kernels.rmsnorm_group_quant import (
    check_group_size,
    describe_rmsnorm_group_quant_fwd,
)
from kerneltune.runtime import launch
from kerneltune.runtime.resolve import config_for
from kerneltune.runtime.routing import (
    check_native_activation,
    on_other_gpu,
    quant_dtype,
    runs_native,
)

RMSNORM_GROUP_QUANT_FWD = launch.register(launch.Kernel(
    "rmsnorm_group_quant_fwd", describe_rmsnorm_group_quant_fwd,
    lambda x, residual, weight, eps, quant, group, ue8m0, column_major: (
        residual is None, quant, group, ue8m0, column_major)))


#: The bound-call sites (`launch.bind`) of the two public functions.
_GROUP_QUANT, _ADD_QUANT = "rms_norm_group_quant", "add_rms_norm_quant"


def _scales_like(x: Tensor, groups: int, column_major: bool) -> Tensor:
    """An empty fp32 scales tensor of x's leading shape and `groups`, laid out as the kernel's."""
    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    strides = (1, m) if column_major else (groups, 1)
    return x.new_empty_strided((m, groups), strides, dtype=torch.float32).view(
        *x.shape[:-1], groups)


def _forward(x: Tensor, residual: Tensor | None, weight: Tensor, eps: float, quant: str,
             group: int | None, ue8m0: bool, column_major: bool, bound: tuple | None = None
             ) -> tuple[Tensor, ...]:
    """q (x's shape), the scales (x.shape[:-1] + (groups,)) and, with a residual, the new
    residual (x's shape). `bound`: the public call's arguments, whose key the launch is bound
    to (`launch.bind`)."""
    x2 = as_rows(x)
    r2 = None if residual is None else as_rows(residual)
    m, n = x2.shape
    spec = rmsnorm_group_quant_spec.FWD if residual is None else rmsnorm_group_quant_spec.ADD_FWD
    config = config_for(spec, m, n, x.dtype, (("group_size", group or 0), ("quant", quant)))
    w = weight if weight.stride(0) == 1 else weight.contiguous()
    inputs = (x2, r2, w, eps, quant, group, ue8m0, column_major)
    out = launch.launch(RMSNORM_GROUP_QUANT_FWD, config, id(config), *inputs)
    q, scales = out[0].view(x.shape), out[1].view(*x.shape[:-1], out[1].shape[1])
    result = (q, scales) if residual is None else (q, scales, out[2].view(x.shape))
    if bound is not None:
        launch.bind(_GROUP_QUANT if residual is None else _ADD_QUANT, RMSNORM_GROUP_QUANT_FWD,
                    config, bound, inputs, result)
    return result


def _native(x: Tensor, residual: Tensor | None, weight: Tensor, eps: float, quant: str,
            group: int | None, ue8m0: bool, column_major: bool) -> tuple[Tensor, ...]:
    """The kernels' formula in plain torch, r in fp32 (`kerneltune.runtime.native`)."""
    from kerneltune.kernels.rmsnorm_group_quant_spec import _group_quantise_ref, added_ref

    s = added_ref(x, residual)
    s2 = s.reshape(-1, s.shape[-1])
    r = torch.rsqrt(s2.float().pow(2).mean(-1) + eps)
    ref = _group_quantise_ref(s2, weight, quant, group, ue8m0, r)
    scales = _scales_like(x, ref.scale.shape[1], column_major)
    scales.copy_(ref.scale.view(scales.shape))
    q = ref.q.reshape(x.shape)
    return (q, scales) if residual is None else (q, scales, s)


# ------------------------------------------------------------------------- custom op


@torch.library.custom_op("kerneltune::rms_norm_group_quant", mutates_args=())
def rms_norm_group_quant_op(x: Tensor, residual: Tensor | None, weight: Tensor, eps: float,
                            quant: str, group_size: int, scale_ue8m0: bool,
                            column_major_scales: bool) -> tuple[Tensor, Tensor, Tensor]:
    """q, the scales and the new residual (empty without a residual); group_size 0 is one
    group a row."""
    out = _forward(x, residual, weight, eps, quant, group_size or None, scale_ue8m0,
                   column_major_scales)
    return out if residual is not None else (*out, x.new_empty((0,)))


@rms_norm_group_quant_op.register_fake
def _(x: Tensor, residual: Tensor | None, weight: Tensor, eps: float, quant: str,
      group_size: int, scale_ue8m0: bool, column_major_scales: bool
      ) -> tuple[Tensor, Tensor, Tensor]:
    groups = x.shape[-1] // group_size if group_size else 1
    new_res = x.new_empty(x.shape) if residual is not None else x.new_empty((0,))
    return (x.new_empty(x.shape, dtype=quant_dtype(quant)),
            _scales_like(x, groups, column_major_scales), new_res)


# ------------------------------------------------------------------------ public API


def _flag(value: Any, name: str) -> bool:
    if type(value) is not bool:
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def _call(x: Any, residual: Any, weight: Any, eps: Any, quant: Any, group_size: Any,
          scale_ue8m0: Any, column_major_scales: Any, has_residual: bool
          ) -> tuple[Tensor, ...]:
    """Check, then run on the kernels, the custom op or the torch formula; an eager call like
    one before (its checks passed, its launch bound) goes straight to the launch."""
    public = (x, residual, weight, eps, quant, group_size, scale_ue8m0, column_major_scales)
    compiling = torch.compiler.is_compiling()
    if not compiling:
        out = launch.run_bound(_ADD_QUANT if has_residual else _GROUP_QUANT, *public)
        if out is not None:
            return out
    quant_dtype(quant)
    ue8m0, column_major = (_flag(scale_ue8m0, "scale_ue8m0"),
                           _flag(column_major_scales, "column_major_scales"))
    native_call = runs_native(x)
    if native_call:
        check_native_activation(x)
    else:
        check_activation(x)
    check_weight(weight, x)
    if has_residual:
        check_like(x, residual, "residual")
    eps = check_eps(eps)
    group = check_group_size(group_size, x.shape[-1])
    args = (x, residual, weight, eps, quant, group, ue8m0, column_major)
    if native_call:
        return _native(*args)
    if compiling:
        out = rms_norm_group_quant_op(x, residual, weight, eps, quant, group or 0, ue8m0,
                                      column_major)
        return out if residual is not None else out[:2]
    if on_other_gpu(x):  # Triton launches on the current device
        with torch.cuda.device(x.device):
            return _forward(*args)
    return _forward(*args, bound=public)


def rms_norm_group_quant(x: Tensor, weight: Tensor, eps: float = 1e-6, quant: str = "fp8",
                         group_size: int | None = 128, scale_ue8m0: bool = False,
                         column_major_scales: bool = False) -> tuple[Tensor, Tensor]:
    """RMSNorm (llama mode) then per-token-group dynamic quantization, for a block-quantized
    linear layer (DeepSeek-style fp8, vLLM's ``rms_norm_per_block_quant``).

    Per group of `group_size` (32, 64, 128 or 256; the hidden size a multiple of it) columns:
    fp8 (float8_e4m3fn) ``s = max(max|y| / 448, 1 / (448 · 512))``, ``q = e4m3(clamp(y / s,
    ±448))``; int8 ``s = max(max|y| / 127, eps32)``, ``q = round_half_even(y / s)`` clamped to
    [-128, 127]. `scale_ue8m0` rounds each s up to a power of two. Returns q (x's shape) and
    the scales (float32, ``x.shape[:-1] + (N / group_size,)``; with `column_major_scales` laid
    out column-major, strides (1, M) over the M rows), so ``q.float() * s`` repeated over each
    group dequantizes. `group_size` None is one group a row: `kerneltune.rms_norm_quant`'s q
    and scales (``x.shape[:-1] + (1,)``). Not differentiable.
    """
    q, scales = _call(x, None, weight, eps, quant, group_size, scale_ue8m0, column_major_scales,
                      has_residual=False)
    return q, scales


def add_rms_norm_quant(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6,
                       quant: str = "fp8", group_size: int | None = None,
                       scale_ue8m0: bool = False, column_major_scales: bool = False
                       ) -> tuple[Tensor, Tensor, Tensor]:
    """Fused residual add, RMSNorm and dynamic quantization (vLLM's fused add + RMSNorm +
    quant): ``s = x + residual`` rounded to x's dtype, then `rms_norm_group_quant(s, ...)`, or
    with `group_size` None per token, as `kerneltune.rms_norm_quant` (scales
    ``x.shape[:-1] + (1,)``). Returns (q, scale, s); s is the new residual. Not
    differentiable."""
    q, scale, s = _call(x, residual, weight, eps, quant, group_size, scale_ue8m0,
                        column_major_scales, has_residual=True)
    return q, scale, s


__all__ = ["add_rms_norm_quant", "rms_norm_group_quant", "rms_norm_group_quant_op"]
