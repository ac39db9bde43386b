"""LayerNorm for model code: `layer_norm` and `LayerNorm`, a drop-in for ``torch.nn.LayerNorm``.

``y = (x − mean) · rstd · w + b`` over the last dimension, mean and the biased variance in fp32,
``rstd = 1 / sqrt(var + eps)``, one cast to x's dtype (the kernels of
`kerneltune.kernels.layernorm`). Weight and bias are optional. The forward saves mean and rstd
(fp32) for the backward (`kerneltune.kernels.layernorm_bwd`), which gives dx, dw and db (dw
and db summed in fp32).

As the RMSNorm functions of `kerneltune.runtime.ops`: each call's config is resolved once per
kernel, N, dtype and M bucket (`config_for`); an eager call that records for autograd goes
through a plain `torch.autograd.Function`, `torch.compile` through the custom ops
``kerneltune::layer_norm`` and ``kerneltune::layer_norm_backward`` (fake implementations
registered); the forward launches through the runtime's fast launch (`launch.Kernel`) and is
then bound to its call key (`launch.bind`: a later call like it allocates and launches, with no
checks or description in between), the backward's several launches are replayed
(`replay.Replayed`). Where the kernels cannot run (no CUDA, no interpreter) the torch formula
runs in fp32, with one warning.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from kerneltune.kernels import layernorm_spec
from kerneltune.kernels._spec import as_rows, check_activation, check_eps, check_weight
from kerneltune.kernels.layernorm import describe_layernorm_fwd
from kerneltune.kernels.layernorm_bwd import describe_layernorm_bwd
from kerneltune.runtime import launch, replay
from kerneltune.runtime.resolve import config_for
from kerneltune.runtime.routing import (
    check_native_activation,
    on_other_gpu,
    records,
    runs_native,
    traces_formula,
)

LAYERNORM_FWD = launch.register(launch.Kernel(
    "layernorm_fwd", describe_layernorm_fwd,
    lambda x, weight, bias, eps: (weight is None, bias is None)))
LAYERNORM_BWD = replay.register(replay.Replayed("layernorm_bwd", describe_layernorm_bwd))


def _vector(t: Tensor | None) -> Tensor | None:
    """A weight or bias with unit stride, as the kernels read it."""
    return t if t is None or t.stride(0) == 1 else t.contiguous()


#: The forward's bound-call sites (`launch.bind`): with mean and rstd kept for the backward, and
#: without (inference: written to a buffer kept with the binding).
_LAYER_NORM, _LAYER_NORM_INFERENCE = "layer_norm", "layer_norm inference"


def _layer_norm_forward(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float,
                        keep_stats: bool = True) -> tuple[Tensor, ...]:
    """y (x's shape and dtype), mean and rstd (x.shape[:-1], fp32); y alone where the
    statistics are not kept."""
    site = _LAYER_NORM if keep_stats else _LAYER_NORM_INFERENCE
    out = launch.run_bound(site, x, weight, bias, eps)
    if out is not None:
        return out
    x2 = as_rows(x)
    m, n = x2.shape
    config = config_for(layernorm_spec.FWD, m, n, x.dtype)
    inputs = (x2, _vector(weight), _vector(bias), eps)
    y, mean, rstd = launch.launch(LAYERNORM_FWD, config, id(config), *inputs)
    y, mean, rstd = y.view(x.shape), mean.view(x.shape[:-1]), rstd.view(x.shape[:-1])
    kept = (y, mean, rstd) if keep_stats else (y, None, None)
    launch.bind(site, LAYERNORM_FWD, config, (x, weight, bias, eps), inputs, kept)
    return (y, mean, rstd) if keep_stats else (y,)


def _layer_norm_backward(dy: Tensor, x: Tensor, weight: Tensor | None, bias: Tensor | None,
                         mean: Tensor, rstd: Tensor
                         ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """dx (x's shape and dtype), dw and db (None where there is no weight, no bias)."""
    x2, dy2 = as_rows(x), as_rows(dy)
    m, n = x2.shape
    config = config_for(layernorm_spec.BWD, m, n, x.dtype)
    dx, *sums = replay.run(LAYERNORM_BWD, config, id(config), dy2, x2, _vector(weight),
                           _vector(bias), mean.reshape(m), rstd.reshape(m))
    dw = sums.pop(0) if weight is not None else None
    db = sums.pop(0) if bias is not None else None
    return dx.view(x.shape), dw, db


def _native_layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
                       ) -> Tensor:
    """The kernels' formula in plain torch: fp32 arithmetic, one cast to x's dtype."""
    return F.layer_norm(x.float(), x.shape[-1:], None if weight is None else weight.float(),
                        None if bias is None else bias.float(), eps).to(x.dtype)


# ------------------------------------------------------------------------- custom ops


@torch.library.custom_op("kerneltune::layer_norm", mutates_args=())
def layer_norm_op(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """y (x's shape and dtype), mean and rstd (x.shape[:-1], float32)."""
    return _layer_norm_forward(x, weight, bias, eps)


@layer_norm_op.register_fake
def _(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
      ) -> tuple[Tensor, Tensor, Tensor]:
    stats = x.new_empty(x.shape[:-1], dtype=torch.float32)
    return x.new_empty(x.shape), stats, torch.empty_like(stats)


def _absent(t: Tensor | None, like: Tensor) -> Tensor:
    """What the backward op returns for the gradient of an absent weight or bias (an op's
    outputs are tensors): an empty one."""
    return like.new_empty((0,)) if t is None else t


@torch.library.custom_op("kerneltune::layer_norm_backward", mutates_args=())
def layer_norm_backward_op(dy: Tensor, x: Tensor, weight: Tensor | None, bias: Tensor | None,
                           mean: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """dx (x's shape and dtype), dw and db (the weight's and the bias's shape and dtype; empty
    where there is none)."""
    dx, dw, db = _layer_norm_backward(dy, x, weight, bias, mean, rstd)
    return dx, _absent(dw, x), _absent(db, x)


@layer_norm_backward_op.register_fake
def _(dy: Tensor, x: Tensor, weight: Tensor | None, bias: Tensor | None, mean: Tensor,
      rstd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return (x.new_empty(x.shape), _absent(None if weight is None else weight.new_empty(
        weight.shape), x), _absent(None if bias is None else bias.new_empty(bias.shape), x))


def _setup(ctx: Any, inputs: tuple, output: tuple) -> None:
    x, weight, bias, _eps = inputs
    ctx.save_for_backward(x, weight, bias, output[1], output[2])


def _grads(ctx: Any, dx: Tensor, dw: Tensor | None, db: Tensor | None) -> tuple:
    needs = ctx.needs_input_grad
    return (dx if needs[0] else None, dw if needs[1] else None, db if needs[2] else None, None)


def _layer_norm_grad(ctx: Any, dy: Tensor, _dmean: Tensor | None, _drstd: Tensor | None
                     ) -> tuple:
    """The gradients of `layer_norm_op`'s inputs, through the backward op (which torch.compile
    traces)."""
    x, weight, bias, mean, rstd = ctx.saved_tensors
    dx, dw, db = layer_norm_backward_op(dy, x, weight, bias, mean, rstd)
    return _grads(ctx, dx, dw, db)


layer_norm_op.register_autograd(_layer_norm_grad, setup_context=_setup)


class _LayerNormFunction(torch.autograd.Function):
    """`layer_norm_op` with its autograd, for eager calls: no dispatcher in between."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
                ) -> Tensor:
        output = _layer_norm_forward(x, weight, bias, eps)
        _setup(ctx, (x, weight, bias, eps), output)
        return output[0]

    @staticmethod
    @once_differentiable  # the kernels are: a second derivative is a clear error
    def backward(ctx: Any, dy: Tensor) -> tuple:
        x, weight, bias, mean, rstd = ctx.saved_tensors
        return _grads(ctx, *_layer_norm_backward(dy, x, weight, bias, mean, rstd))


# ------------------------------------------------------------------------ public API


def _check(x: Any, weight: Any, bias: Any, eps: Any, anywhere: bool) -> float:
    """The full checks (`anywhere`: x may be on a device the kernels do not run on); eps as a
    float."""
    if anywhere:
        check_native_activation(x)
    else:
        check_activation(x)
    for name, v in (("weight", weight), ("bias", bias)):
        if v is not None:
            check_weight(v, x, name)
    return check_eps(eps)


def layer_norm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """LayerNorm over the last dimension: ``y = (x − mean) · rstd · w + b`` with mean and the
    biased variance in fp32 and ``rstd = 1 / sqrt(var + eps)``, as
    ``torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias, eps)``; weight and bias
    may each be None.

    Differentiable in x, weight and bias. Output has x's shape and dtype.
    """
    compiling, recorded = torch.compiler.is_compiling(), records(x, weight, bias)
    if not compiling and not recorded:
        # A call like one before: its checks passed and its launch is bound (see launch.py).
        out = launch.run_bound(_LAYER_NORM_INFERENCE, x, weight, bias, eps)
        if out is not None:
            return out[0]
    if runs_native(x) or traces_formula():
        eps = _check(x, weight, bias, eps, anywhere=True)
        return _native_layer_norm(x, weight, bias, eps)
    eps = _check(x, weight, bias, eps, anywhere=False)
    if compiling:
        return layer_norm_op(x, weight, bias, eps)[0]
    if on_other_gpu(x):
        with torch.cuda.device(x.device):
            return layer_norm(x, weight, bias, eps)
    if recorded:
        return _LayerNormFunction.apply(x, weight, bias, eps)
    return _layer_norm_forward(x, weight, bias, eps, keep_stats=False)[0]


class LayerNorm(nn.Module):
    """``torch.nn.LayerNorm`` with the tuned kernels: the same constructor, attributes
    (`normalized_shape`, `eps`, `elementwise_affine`) and state dict (`weight`, `bias`).

    Normalizes over the trailing `normalized_shape` dimensions, which the kernels see as one
    (their weight and bias flattened with them).
    """

    def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5,
                 elementwise_affine: bool = True, bias: bool = True,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        shape = ((normalized_shape,) if isinstance(normalized_shape, int)
                 else tuple(normalized_shape))
        if not shape or any(type(d) is not int or d < 1 for d in shape):
            raise ValueError(f"normalized_shape must be positive ints, got {normalized_shape!r}")
        self.normalized_shape = shape
        self.eps = check_eps(eps)
        self.elementwise_affine = elementwise_affine
        self.register_parameter("weight", nn.Parameter(torch.ones(
            shape, device=device, dtype=dtype)) if elementwise_affine else None)
        self.register_parameter("bias", nn.Parameter(torch.zeros(
            shape, device=device, dtype=dtype)) if elementwise_affine and bias else None)

    def forward(self, x: Tensor) -> Tensor:
        shape, k = self.normalized_shape, len(self.normalized_shape)
        if not isinstance(x, Tensor) or x.dim() < k or tuple(x.shape[x.dim() - k:]) != shape:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"input of shape {got} does not end in normalized_shape {shape}")
        if k == 1:
            return layer_norm(x, self.weight, self.bias, self.eps)
        n = math.prod(shape)
        flat = [None if p is None else p.reshape(n) for p in (self.weight, self.bias)]
        return layer_norm(x.reshape(*x.shape[:-k], n), *flat, self.eps).view(x.shape)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}, bias={self.bias is not None}")

    @classmethod
    def from_torch(cls, module: nn.LayerNorm) -> LayerNorm:
        """The equivalent of a ``torch.nn.LayerNorm``, sharing its weight and bias
        `Parameter`s."""
        if not isinstance(module, nn.LayerNorm):
            raise TypeError(f"expected a torch.nn.LayerNorm, got {type(module).__name__}")
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.normalized_shape = tuple(module.normalized_shape)
        new.eps = check_eps(module.eps)
        new.elementwise_affine = module.elementwise_affine
        new.register_parameter("weight", module.weight)
        new.register_parameter("bias", module.bias)
        new.train(module.training)
        return new
