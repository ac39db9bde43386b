"""Where a public function's call runs, shared by every runtime module that has one.

A call on a tensor the kernels cannot take computes the torch formula
(`kerneltune.runtime.native`); one on another GPU than the current is made again with that GPU
current; one autograd records goes through the op's autograd function. The checks of the
quantization mode are here too: the per-token and the grouped quant functions take the same.

Under torch.compile the norms (`rms_norm`, `add_rms_norm`, `layer_norm`) trace the torch
formula by default, as vLLM's custom ops do under Inductor: Inductor fuses it with the ops
around it (the residual add, the casts, the next elementwise op), which a custom op hides from
it. `KERNELTUNE_COMPILE=kernels` keeps the kernels there as opaque custom ops. The
quant functions always call their kernels: Inductor's code for them is slower (the H200 suite).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor

from kerneltune.kernels._spec import TORCH_DTYPES, check_activation
from kerneltune.runtime import _launchers, native

QUANT_MODES = ("int8", "fp8")
ACTIVATION_DTYPES = frozenset(TORCH_DTYPES.values())
#: What the norms run inside torch.compile (`KERNELTUNE_COMPILE`; see the module doc).
COMPILE_MODES = ("native", "kernels")


@torch.compiler.assume_constant_result  # read while tracing; the graph keeps the answer
def compile_mode() -> str:
    """`KERNELTUNE_COMPILE`: "native" (the default) or "kernels"; a clear error for another."""
    mode = os.environ.get("KERNELTUNE_COMPILE", "native").strip().lower() or "native"
    if mode not in COMPILE_MODES:
        raise ValueError(f"KERNELTUNE_COMPILE={mode!r}: expected one of {COMPILE_MODES}")
    return mode


def traces_formula() -> bool:
    """Whether a norm call is being traced by torch.compile in the "native" mode, so it computes
    the torch formula for Inductor to fuse rather than calling its kernel."""
    return torch.compiler.is_compiling() and compile_mode() == "native"


def runs_native(x: Any) -> bool:
    """Whether x is a tensor the kernels cannot take, so its call computes the torch formula
    (`kerneltune.runtime.native`, with one warning); anything else goes on to the checks."""
    if not isinstance(x, Tensor) or x.is_cuda or native.kernels_run_on(x):
        return False
    if not torch.compiler.is_compiling():  # (warned by the eager calls: no graph break)
        native.warn_native(x)
    return True


def check_native_activation(x: Tensor) -> None:
    """`check_activation` short of its device check, with its messages."""
    if x.dtype not in ACTIVATION_DTYPES or not x.dim() or not x.shape[-1]:
        check_activation(x)


def float8_dtype() -> torch.dtype:
    """torch.float8_e4m3fn, or a clear error on a torch build without float8 types."""
    dtype = getattr(torch, "float8_e4m3fn", None)
    if dtype is None:
        raise TypeError(
            f"quant='fp8' needs torch.float8_e4m3fn, which this torch build ({torch.__version__}) "
            "does not have; use quant='int8'"
        )
    return dtype


def quant_dtype(quant: Any) -> torch.dtype:
    """The dtype of q for a quantization mode; a clear error for an unknown one."""
    if quant == "int8":
        return torch.int8
    if quant == "fp8":
        return float8_dtype()
    raise ValueError(f"unknown quant mode {quant!r}; expected one of {QUANT_MODES}")


def on_other_gpu(x: Tensor) -> bool:
    """Whether x is on a GPU other than the current one. Triton launches on the current device,
    which model code split over GPUs (``device_map="auto"``) does not switch: such a call is
    made again with x's device current."""
    return x.is_cuda and x.get_device() != _launchers.current_device()


def records(*tensors: Any) -> bool:
    """Whether autograd records a call on these inputs (anything else among them never asks)."""
    return torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors)
