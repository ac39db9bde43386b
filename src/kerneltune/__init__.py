"""kerneltune: autotuned Triton normalization kernels.

Model code uses `rms_norm`, `add_rms_norm`, `rms_norm_quant` (per token or per group),
`rms_norm_group_quant`, `add_rms_norm_quant`, `rms_norm_fake_quant`, `layer_norm`, the
`RMSNorm` and `LayerNorm` modules, `patch_model`, `patch_transformers` and `fuse_residuals`.
They load lazily (torch and Triton on first use), so the command line, the service and the
tuner import this package without paying for them, and inference never imports the service's
or the tuner's dependencies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_RUNTIME = (
    "LayerNorm",
    "RMSNorm",
    "add_rms_norm",
    "add_rms_norm_quant",
    "explain",
    "fuse_residuals",
    "layer_norm",
    "patch_model",
    "patch_transformers",
    "rms_norm",
    "rms_norm_fake_quant",
    "rms_norm_group_quant",
    "rms_norm_quant",
    "unfuse_residuals",
    "unpatch_model",
    "unpatch_transformers",
)

__all__ = [
    "LayerNorm",
    "RMSNorm",
    "__version__",
    "add_rms_norm",
    "add_rms_norm_quant",
    "explain",
    "fuse_residuals",
    "layer_norm",
    "patch_model",
    "patch_transformers",
    "rms_norm",
    "rms_norm_fake_quant",
    "rms_norm_group_quant",
    "rms_norm_quant",
    "unfuse_residuals",
    "unpatch_model",
    "unpatch_transformers",
]

if TYPE_CHECKING:
    from kerneltune.runtime import (
        LayerNorm,
        RMSNorm,
        add_rms_norm,
        add_rms_norm_quant,
        explain,
        fuse_residuals,
        layer_norm,
        patch_model,
        patch_transformers,
        rms_norm,
        rms_norm_fake_quant,
        rms_norm_group_quant,
        rms_norm_quant,
        unfuse_residuals,
        unpatch_model,
        unpatch_transformers,
    )


def __getattr__(name: str) -> Any:
    if name in _RUNTIME:
        value = getattr(importlib.import_module("kerneltune.runtime"), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'kerneltune' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_RUNTIME})
