"""The public functions: RMSNorm, fused residual add + RMSNorm, RMSNorm + quantization.

Each is a torch custom op (``torch.ops.kerneltune.*``) with a fake implementation, so
``torch.compile`` traces through it without a graph break, and the differentiable ones have
their backward registered on the op. (Under torch.compile the norms trace the torch formula
unless ``KERNELTUNE_COMPILE=kernels``: `kerneltune.runtime.routing` says why.) Eager calls
that need no gradient skip the dispatcher and autograd altogether: validate, look the config
up in a dict, launch; a call like an earlier one (types, shapes, strides, dtypes, device,
alignment, scalars) skips even those and makes the launch bound to its key (`launch.bind`).
Eager calls that do record for autograd go through a plain `torch.autograd.Function` with the
op's own forward, saved tensors and backward: a custom op called eagerly spends tens of
microseconds of host time in the dispatcher and in its autograd wrapper, more than the kernels
take on the GPU at most training shapes.

Shapes: any number of leading dimensions (flattened to M rows), rows may be strided; the
kernels see (M, N) views with unit stride along N.

Rounding (Liger-Kernel's casting modes; ``casting_mode=None`` picks llama for offset 0, gemma
otherwise)::

    llama:  y = w · (x · r).to(x.dtype)                x̂ rounded first (HF Llama); offset 0
    gemma:  y = (x · r · (offset + w)).to(x.dtype)     all in fp32, one final cast: Gemma's
                                                       with offset 1, OLMo2's with offset 0

The kernels take the fp32 product whenever their offset is not 0. OLMo2's formula runs on them
with offset `FP32_PRODUCT_OFFSET`, the smallest fp32 subnormal: offset + w is w exactly for every
|w| >= 2^-124, and with w = 0 the product (below 2^-140) rounds to the same signed zero in fp16
and bf16, so the result is OLMo2's bit for bit; in fp32 both orders are one (offset 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from kerneltune.kernels import add_rmsnorm_spec, rmsnorm_fwd_spec
from kerneltune.kernels._spec import (
    as_rows,
    check_activation,
    check_eps,
    check_like,
    check_weight,
)
from kerneltune.runtime import launch, native, replay
from kerneltune.runtime.group_quant import rms_norm_group_quant
from kerneltune.runtime.resolve import config_for
from kerneltune.runtime.routing import (
    ACTIVATION_DTYPES,
    check_native_activation,
    on_other_gpu,
    quant_dtype,
    records,
    runs_native,
    traces_formula,
)

CASTING_MODES = ("llama", "gemma")
#: The kernels' offset for gemma rounding at offset 0 in fp16 and bf16 (see the module doc).
FP32_PRODUCT_OFFSET = 2.0**-149


# ------------------------------------------------------------------------------ checks


def _check_offset(offset: Any) -> float:
    if not isinstance(offset, int | float) or isinstance(offset, bool) or not math.isfinite(offset):
        raise ValueError(f"offset must be a finite number, got {offset!r}")
    return float(offset)


def kernel_offset(offset: Any, casting_mode: str, x: Any) -> float:
    """The offset the kernels take for `casting_mode` rounding with `offset` on x's dtype."""
    offset = _check_offset(offset)
    if casting_mode == "gemma":
        if offset != 0.0 or getattr(x, "dtype", None) == torch.float32:
            return offset
        return FP32_PRODUCT_OFFSET
    if casting_mode == "llama":
        if offset != 0.0:
            raise ValueError(f"casting_mode='llama' takes offset 0, got {offset}: the kernels "
                             "round x̂ before the scale only where the scale is w alone; use "
                             "casting_mode='gemma'")
        return offset
    raise ValueError(f"unknown casting_mode {casting_mode!r}; expected one of {CASTING_MODES}")


_INF = math.inf


def _check_norm(x: Any, weight: Any, eps: Any, offset: Any, anywhere: bool = False) -> None:
    # The common case in a handful of attribute reads (this runs on every call); anything else,
    # a CPU tensor under the interpreter among it, goes through the full checks, which name the
    # problem. `anywhere`: x may be on any device (the torch formula's calls).
    if (
        type(eps) is float and 0.0 <= eps < _INF
        and type(offset) is float and -_INF < offset < _INF
        and isinstance(x, Tensor) and isinstance(weight, Tensor) and x.is_cuda
        and x.dtype in ACTIVATION_DTYPES and weight.dtype in ACTIVATION_DTYPES
        and x.dim() and x.shape[-1] and weight.shape == x.shape[-1:]
        and x.device == weight.device
    ):
        return
    (check_native_activation if anywhere else check_activation)(x)
    check_weight(weight, x)
    check_eps(eps)
    _check_offset(offset)


def _check_optional_vector(v: Any, x: Tensor, name: str) -> None:
    if v is not None:
        check_weight(v, x, name)


_LLAMA_OPTION, _GEMMA_OPTION = (("offset", 0.0),), (("offset", 1.0),)


def _offset_option(offset: float) -> tuple[tuple[str, float], ...]:
    """The kernels' offset option a config is resolved with: 0 (llama) or 1 (gemma, the launch
    of every other offset, `FP32_PRODUCT_OFFSET` among them), the values they are tuned at."""
    return _LLAMA_OPTION if offset == 0.0 else _GEMMA_OPTION


def _unit_stride(w: Tensor | None) -> Tensor | None:
    return w if w is None or w.stride(0) == 1 else w.contiguous()


# ---------------------------------------------------------------------- implementations


# Each launch is bound, after its first call, to a key of its call site and everything that
# decided it (`launch.bind`); a later call with that key allocates and launches, nothing more.
# A site names what its calls keep: the same arguments bind once per site.
_RMS_NORM, _RMS_NORM_INFERENCE = "rms_norm", "rms_norm inference"
_ADD_RMS_NORM, _ADD_RMS_NORM_INFERENCE = "add_rms_norm", "add_rms_norm inference"
_QUANT, _QUANT_Q = "rms_norm_quant", "rms_norm_quant q"


def _rms_norm_forward(x: Tensor, weight: Tensor, eps: float, offset: float,
                      keep_rstd: bool = True) -> tuple[Tensor, ...]:
    """(y, rstd), or (y,) where rstd is not kept (inference: written to a reused buffer)."""
    site = _RMS_NORM if keep_rstd else _RMS_NORM_INFERENCE
    out = launch.run_bound(site, x, weight, eps, offset)
    if out is not None:
        return out
    x2 = x if x.dim() == 2 and x.stride(1) == 1 else as_rows(x)
    m, n = x2.shape
    config = config_for(rmsnorm_fwd_spec.SPEC, m, n, x.dtype, _offset_option(offset))
    plan = launch.RMSNORM_FWD if keep_rstd else launch.RMSNORM_FWD_INFERENCE
    inputs = (x2, _unit_stride(weight), eps, offset)
    y, rstd = launch.launch(plan, config, id(config), *inputs)
    if x2 is not x:  # (a view costs microseconds of host time, more where autograd records)
        y, rstd = y.view(x.shape), rstd.view(x.shape[:-1])
    launch.bind(site, plan, config, (x, weight, eps, offset), inputs,
                (y, rstd if keep_rstd else None))
    return (y, rstd) if keep_rstd else (y,)


def _rms_norm_backward(dy: Tensor, x: Tensor, weight: Tensor, rstd: Tensor, offset: float
                       ) -> tuple[Tensor, Tensor]:
    from kerneltune.kernels import rmsnorm_bwd_spec

    x2, dy2 = as_rows(x), as_rows(dy)
    m, n = x2.shape
    config = config_for(rmsnorm_bwd_spec.SPEC, m, n, x.dtype, _offset_option(offset))
    dx, dw = replay.run(replay.RMSNORM_BWD, config, id(config), dy2, x2, _unit_stride(weight),
                        rstd if rstd.dim() == 1 else rstd.reshape(m), offset)
    return (dx if x.dim() == 2 else dx.view(x.shape)), dw


def _add_rms_norm_forward(x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float,
                          keep_rstd: bool = True) -> tuple[Tensor, ...]:
    """(y, s, rstd), or (y, s) where rstd is not kept."""
    site = _ADD_RMS_NORM if keep_rstd else _ADD_RMS_NORM_INFERENCE
    out = launch.run_bound(site, x, residual, weight, eps, offset)
    if out is not None:
        return out
    x2, r2 = as_rows(x), as_rows(residual)
    m, n = x2.shape
    config = config_for(add_rmsnorm_spec.SPEC, m, n, x.dtype, _offset_option(offset))
    inputs = (x2, r2, _unit_stride(weight), eps, offset)
    y, s, rstd = launch.launch(launch.ADD_RMSNORM_FWD, config, id(config), *inputs)
    if x.dim() != 2:
        y, s, rstd = y.view(x.shape), s.view(x.shape), rstd.view(x.shape[:-1])
    launch.bind(site, launch.ADD_RMSNORM_FWD, config, (x, residual, weight, eps, offset), inputs,
                (y, s, rstd if keep_rstd else None))
    return (y, s, rstd) if keep_rstd else (y, s)


def _rms_norm_quant_forward(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float,
                            quant: str, keep_scale: bool = True) -> tuple[Tensor, ...]:
    """(q, the per-row scale), or (q,) where the scale is not kept."""
    from kerneltune.kernels import rmsnorm_quant_spec

    site = _QUANT if keep_scale else _QUANT_Q
    out = launch.run_bound(site, x, weight, bias, eps, quant)
    if out is not None:
        return out
    x2 = as_rows(x)
    m, n = x2.shape
    config = config_for(rmsnorm_quant_spec.SPEC, m, n, x.dtype, (("quant", quant),))
    inputs = (x2, _unit_stride(weight), _unit_stride(bias), eps, quant)
    q, scale = launch.launch(launch.RMSNORM_QUANT_FWD, config, id(config), *inputs)
    q, scale = q.view(x.shape), scale.reshape(*x.shape[:-1], 1)
    launch.bind(site, launch.RMSNORM_QUANT_FWD, config, (x, weight, bias, eps, quant), inputs,
                (q, scale if keep_scale else None))
    return (q, scale) if keep_scale else (q,)


# ------------------------------------------------------------------------- custom ops


@torch.library.custom_op("kerneltune::rms_norm", mutates_args=())
def rms_norm_op(x: Tensor, weight: Tensor, eps: float, offset: float) -> tuple[Tensor, Tensor]:
    """y (x's shape and dtype) and rstd (x.shape[:-1], float32)."""
    return _rms_norm_forward(x, weight, eps, offset)


@rms_norm_op.register_fake
def _(x: Tensor, weight: Tensor, eps: float, offset: float) -> tuple[Tensor, Tensor]:
    return x.new_empty(x.shape), x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("kerneltune::rms_norm_backward", mutates_args=())
def rms_norm_backward_op(dy: Tensor, x: Tensor, weight: Tensor, rstd: Tensor, offset: float
                         ) -> tuple[Tensor, Tensor]:
    """dx (x's shape and dtype) and dw (weight's shape and dtype)."""
    return _rms_norm_backward(dy, x, weight, rstd, offset)


@rms_norm_backward_op.register_fake
def _(dy: Tensor, x: Tensor, weight: Tensor, rstd: Tensor, offset: float) -> tuple[Tensor, Tensor]:
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


def _rms_norm_setup(ctx: Any, inputs: tuple, output: tuple) -> None:
    x, weight, _eps, offset = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.offset = offset


#: The backward of an (M, N) norm: (dy, x, weight, rstd, offset) -> (dx, dw).
Backward = Callable[[Tensor, Tensor, Tensor, Tensor, float], tuple[Tensor, Tensor]]


def _rms_norm_grad(ctx: Any, dy: Tensor, _drstd: Tensor | None,
                   backward: Backward | None = None) -> tuple:
    """The gradients of `rms_norm_op`'s inputs; the backward through its custom op (which
    torch.compile traces) unless told another."""
    x, weight, rstd = ctx.saved_tensors
    dx, dw = (backward or rms_norm_backward_op)(dy, x, weight, rstd, ctx.offset)
    return dx, dw if ctx.needs_input_grad[1] else None, None, None


rms_norm_op.register_autograd(_rms_norm_grad, setup_context=_rms_norm_setup)


@torch.library.custom_op("kerneltune::add_rms_norm", mutates_args=())
def add_rms_norm_op(x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float
                    ) -> tuple[Tensor, Tensor, Tensor]:
    """y, the new residual x + residual (both x's shape and dtype), rstd (float32)."""
    return _add_rms_norm_forward(x, residual, weight, eps, offset)


@add_rms_norm_op.register_fake
def _(x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float
      ) -> tuple[Tensor, Tensor, Tensor]:
    return x.new_empty(x.shape), x.new_empty(x.shape), x.new_empty(x.shape[:-1],
                                                                   dtype=torch.float32)


def _add_rms_norm_setup(ctx: Any, inputs: tuple, output: tuple) -> None:
    _x, _residual, weight, _eps, offset = inputs
    ctx.save_for_backward(output[1], weight, output[2])
    ctx.offset = offset


def _add_rms_norm_grad(ctx: Any, dy: Tensor | None, d_residual: Tensor | None,
                       _drstd: Tensor | None, backward: Backward | None = None) -> tuple:
    """`_rms_norm_grad` of `add_rms_norm_op`: s's gradient goes to both x and residual."""
    s, weight, rstd = ctx.saved_tensors
    if dy is None:
        ds, dw = d_residual, None
    else:
        ds, dw = (backward or rms_norm_backward_op)(dy, s, weight, rstd, ctx.offset)
        if d_residual is not None:
            ds = ds + d_residual
    needs = ctx.needs_input_grad
    return (ds if needs[0] else None, ds if needs[1] else None,
            dw if needs[2] else None, None, None)


add_rms_norm_op.register_autograd(_add_rms_norm_grad, setup_context=_add_rms_norm_setup)


@torch.library.custom_op("kerneltune::rms_norm_quant", mutates_args=())
def rms_norm_quant_op(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float,
                      quant: str) -> tuple[Tensor, Tensor]:
    """q (x's shape; int8, float8_e4m3fn, or x's dtype for 'fake') and the per-row scale
    (x.shape[:-1] + (1,), float32)."""
    return _rms_norm_quant_forward(x, weight, bias, eps, quant)


@rms_norm_quant_op.register_fake
def _(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, quant: str
      ) -> tuple[Tensor, Tensor]:
    dtype = x.dtype if quant == "fake" else quant_dtype(quant)
    return (x.new_empty(x.shape, dtype=dtype),
            x.new_empty((*x.shape[:-1], 1), dtype=torch.float32))


# ------------------------------------------------------------------ eager autograd


# (forward takes ctx: with a separate setup_context, every `apply` binds its arguments through
# `inspect.signature`, tens of microseconds of host time a call on an H100 host.)


class _RMSNormFunction(torch.autograd.Function):
    """`rms_norm_op` with its autograd, for eager calls: no dispatcher in between."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, eps: float, offset: float
                ) -> tuple[Tensor, Tensor]:
        output = _rms_norm_forward(x, weight, eps, offset)
        _rms_norm_setup(ctx, (x, weight, eps, offset), output)
        ctx.mark_non_differentiable(output[1])
        ctx.set_materialize_grads(False)  # as the op's: an unused output's gradient is None
        return output

    @staticmethod
    @once_differentiable  # the kernels are: a second derivative is a clear error
    def backward(ctx: Any, dy: Tensor, drstd: Tensor | None) -> tuple:
        return _rms_norm_grad(ctx, dy, drstd, _rms_norm_backward)


class _AddRMSNormFunction(torch.autograd.Function):
    """`add_rms_norm_op` with its autograd, for eager calls: no dispatcher in between."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float
                ) -> tuple[Tensor, Tensor, Tensor]:
        output = _add_rms_norm_forward(x, residual, weight, eps, offset)
        _add_rms_norm_setup(ctx, (x, residual, weight, eps, offset), output)
        ctx.mark_non_differentiable(output[2])
        ctx.set_materialize_grads(False)
        return output

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: Tensor | None, d_residual: Tensor | None,
                 drstd: Tensor | None) -> tuple:
        return _add_rms_norm_grad(ctx, dy, d_residual, drstd, _rms_norm_backward)


# ------------------------------------------------------------------------ public API


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6, offset: float = 0.0,
             casting_mode: str | None = None) -> Tensor:
    """RMSNorm over the last dimension: ``y = w · (x · r).to(x.dtype)`` with
    ``r = rsqrt(mean(x², fp32) + eps)`` (HF Llama); with ``offset`` (1.0 for Gemma) the scale is
    ``offset + w`` and the product stays in fp32 until one final cast. ``casting_mode='gemma'``
    with offset 0 keeps the product in fp32 too (OLMo2); see the module doc.

    Differentiable in x and weight. Output has x's shape and dtype.
    """
    if casting_mode is not None:
        offset = kernel_offset(offset, casting_mode, x)
    compiling, recorded = torch.compiler.is_compiling(), records(x, weight)
    if not compiling and not recorded:
        # A call like one before: its checks passed and its launch is bound (see launch.py).
        out = launch.run_bound(_RMS_NORM_INFERENCE, x, weight, eps, offset)
        if out is not None:
            return out[0]
    if runs_native(x) or traces_formula():
        _check_norm(x, weight, eps, offset, anywhere=True)
        return native.rms_norm(x, weight, float(eps), float(offset))
    _check_norm(x, weight, eps, offset)
    if compiling:
        return rms_norm_op(x, weight, float(eps), float(offset))[0]
    if on_other_gpu(x):
        with torch.cuda.device(x.device):
            return rms_norm(x, weight, eps, offset)
    if recorded:
        return _RMSNormFunction.apply(x, weight, float(eps), float(offset))[0]
    # eager, no autograd: straight to the kernel (Triton specialises on int vs float)
    return _rms_norm_forward(x, weight, float(eps), float(offset), keep_rstd=False)[0]


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6,
                 offset: float = 0.0, casting_mode: str | None = None) -> tuple[Tensor, Tensor]:
    """Fused residual add and RMSNorm, as in a pre-norm decoder layer.

    Returns ``(rms_norm(s, weight, eps, offset, casting_mode), s)`` with ``s = x + residual``
    rounded to x's dtype (the new residual). Differentiable in x, residual and weight.
    """
    if casting_mode is not None:
        offset = kernel_offset(offset, casting_mode, x)
    compiling, recorded = torch.compiler.is_compiling(), records(x, residual, weight)
    if not compiling and not recorded:
        out = launch.run_bound(_ADD_RMS_NORM_INFERENCE, x, residual, weight, eps, offset)
        if out is not None:
            return out
    if runs_native(x) or traces_formula():
        _check_norm(x, weight, eps, offset, anywhere=True)
        check_like(x, residual, "residual")
        return native.add_rms_norm(x, residual, weight, float(eps), float(offset))
    _check_norm(x, weight, eps, offset)
    check_like(x, residual, "residual")
    args = (x, residual, weight, float(eps), float(offset))
    if compiling:
        y, s, _ = add_rms_norm_op(*args)
    elif on_other_gpu(x):
        with torch.cuda.device(x.device):
            return add_rms_norm(x, residual, weight, eps, offset)
    elif recorded:
        y, s, _ = _AddRMSNormFunction.apply(*args)
    else:
        y, s = _add_rms_norm_forward(*args, keep_rstd=False)
    return y, s


def rms_norm_quant(x: Tensor, weight: Tensor, eps: float = 1e-6, quant: str = "int8",
                   group_size: int | None = None, scale_ue8m0: bool = False,
                   column_major_scales: bool = False) -> tuple[Tensor, Tensor]:
    """RMSNorm (llama mode) then per-row dynamic quantization, for a quantized linear layer.

    int8: ``s = max(max|y| / 127, eps32)``, ``q = round_half_even(y / s)`` clamped to
    [-128, 127]; fp8 (float8_e4m3fn): ``s = max(max|y| / 448, 1 / (448 · 512))``,
    ``q = e4m3(clamp(y / s, ±448))``. Returns q (x's shape) and s (float32,
    ``x.shape[:-1] + (1,)``), so ``q.float() * s`` dequantizes. Not differentiable.

    With `group_size` (32 to 256), `scale_ue8m0` or `column_major_scales`, one scale per group
    of `group_size` columns instead: `kerneltune.rms_norm_group_quant`.
    """
    if group_size is not None or scale_ue8m0 or column_major_scales:
        return rms_norm_group_quant(x, weight, eps, quant, group_size, scale_ue8m0,
                                    column_major_scales)
    compiling = torch.compiler.is_compiling()
    if not compiling:
        out = launch.run_bound(_QUANT, x, weight, None, eps, quant)
        if out is not None:
            return out
    quant_dtype(quant)
    if runs_native(x):
        check_native_activation(x)
        check_weight(weight, x)
        return native.rms_norm_quant(x, weight, None, check_eps(eps), quant)
    check_activation(x)
    check_weight(weight, x)
    check_eps(eps)
    if compiling:
        return rms_norm_quant_op(x, weight, None, float(eps), quant)
    if on_other_gpu(x):
        with torch.cuda.device(x.device):
            return rms_norm_quant(x, weight, eps, quant)
    return _rms_norm_quant_forward(x, weight, None, float(eps), quant)


def rms_norm_fake_quant(x: Tensor, gain: Tensor | None = None, bias: Tensor | None = None,
                        eps: float = 1e-5) -> Tensor:
    """RMSNorm with an optional gain and bias, then int8 quantize-dequantize per row (the output
    a quantization-aware model sees): ``scale = 127 / max(max|y|, eps)``,
    ``round(y · scale)`` clamped to [-128, 127], divided by scale. Output in x's dtype.
    Not differentiable.
    """
    compiling = torch.compiler.is_compiling()
    if not compiling:
        out = launch.run_bound(_QUANT_Q, x, gain, bias, eps, "fake")
        if out is not None:
            return out[0]
    native_call = runs_native(x)
    if native_call:
        check_native_activation(x)
    else:
        check_activation(x)
    _check_optional_vector(gain, x, "gain")
    _check_optional_vector(bias, x, "bias")
    check_eps(eps)
    if native_call:
        return native.rms_norm_quant(x, gain, bias, float(eps), "fake")[0]
    if compiling:
        return rms_norm_quant_op(x, gain, bias, float(eps), "fake")[0]
    if on_other_gpu(x):
        with torch.cuda.device(x.device):
            return rms_norm_fake_quant(x, gain, bias, eps)
    return _rms_norm_quant_forward(x, gain, bias, float(eps), "fake", keep_scale=False)[0]

