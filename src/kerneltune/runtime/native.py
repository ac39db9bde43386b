"""The public functions' formulas in plain torch, for tensors the kernels cannot take.

The kernels run on CUDA devices, and on the CPU under Triton's interpreter
(``TRITON_INTERPRET=1``). Anywhere else (a CPU tensor without the interpreter, MPS, XPU, ...)
the public functions compute these formulas instead, as vLLM's custom ops fall back to their
``forward_native``, with one warning per device type. They are the kernels' semantics in fp32
arithmetic (the float64 references of `kerneltune.kernels` hold the ground truth to a tighter
standard, but need float64, which MPS lacks, and twice the memory traffic)::

    r = rsqrt(mean(x², fp32) + eps)
    offset = 0 (llama):  y = (w · (x·r).to(x.dtype)).to(x.dtype)     product in fp32
    offset ≠ 0 (gemma):  y = (x·r · (offset + w)).to(x.dtype)        all in fp32, one cast
    add:                 s = (x + residual, in fp32).to(x.dtype);  y = rms_norm(s)
    quant, fake quant:   the kernel's fp32 steps (`rmsnorm_quant_spec`) on that r

Autograd differentiates them as any torch code; `torch.compile` traces them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kerneltune.kernels import _spec
from kerneltune.runtime.sources import warn_once


def kernels_run_on(x: Tensor) -> bool:
    """Whether the kernels can take `x`: a CUDA tensor, or a CPU one under the interpreter."""
    return x.is_cuda or (x.device.type == "cpu" and _spec.interpreting())


def warn_native(x: Tensor) -> None:
    """The one warning per device type that its calls compute the torch formula."""
    kind = x.device.type
    warn_once(f"native:{kind}",
              f"kerneltune: the kernels do not run on {kind} tensors (they need a CUDA device, "
              "or the CPU with TRITON_INTERPRET=1); computing the torch formula instead")


def _rstd(x: Tensor, eps: float) -> Tensor:
    """r (fp32) with a trailing dimension of 1."""
    xf = x.float()
    return torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


def rms_norm(x: Tensor, weight: Tensor, eps: float, offset: float) -> Tensor:
    """RMSNorm in the kernels' semantics: llama (offset 0) or gemma (offset ≠ 0), written as
    transformers' Llama and Gemma norms write theirs, so that a compiled model traces the same
    graph patched or not. (A product of two bf16 or fp16 tensors is their fp32 product rounded
    once: the llama line is the kernels' rounding.)"""
    xf = x.float()
    xhat = xf * _rstd(xf, eps)  # xf.float() is xf itself: x is cast once
    if offset != 0.0:
        return (xhat * (offset + weight.float())).to(x.dtype)
    if weight.dtype == x.dtype:
        return weight * xhat.to(x.dtype)
    return (weight.float() * xhat.to(x.dtype).float()).to(x.dtype)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float
                 ) -> tuple[Tensor, Tensor]:
    """(rms_norm(s), s) with s = x + residual added in fp32 and rounded to x's dtype (for two
    tensors of one dtype, what their own sum is: transformers' residual add)."""
    s = x + residual if residual.dtype == x.dtype else (x.float() + residual.float()).to(x.dtype)
    return rms_norm(s, weight, eps, offset), s


def rms_norm_quant(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float,
                   quant: str) -> tuple[Tensor, Tensor]:
    """(q, scale) as `rms_norm_quant` returns them (quant 'int8' or 'fp8'), or for 'fake' the
    dequantized values in x's dtype and the per-row multiplier."""
    from kerneltune.kernels.rmsnorm_quant_spec import _quantise_ref

    x2 = x.reshape(-1, x.shape[-1])
    r = _rstd(x2, eps).squeeze(-1)
    out = _quantise_ref(x2, weight, bias, eps, quant, r)
    return out.q.reshape(x.shape), out.scale.reshape(*x.shape[:-1], 1)
