"""What model code runs: the public functions and modules, with configs resolved from tuned
tables (KERNELTUNE_TABLE, the service at KERNELTUNE_URL, the shipped table) or the default.

`explain(kernel, x)` says which source and config a call uses; `reset()` forgets everything
resolved (tests, or after changing the environment).
"""

from kerneltune.runtime.fusion import FusedResiduals, fuse_residuals, unfuse_residuals
from kerneltune.runtime.group_quant import add_rms_norm_quant, rms_norm_group_quant
from kerneltune.runtime.hf import TransformersPatch, patch_transformers, unpatch_transformers
from kerneltune.runtime.layer_norm import LayerNorm, layer_norm
from kerneltune.runtime.modules import (
    Formula,
    RMSNorm,
    hf_formula,
    hf_offset,
    patch_model,
    unpatch_model,
)
from kerneltune.runtime.ops import add_rms_norm, rms_norm, rms_norm_fake_quant, rms_norm_quant
from kerneltune.runtime.resolve import Resolution, config_for, explain, reset, resolver
from kerneltune.runtime.sources import KerneltuneWarning

__all__ = [
    "Formula",
    "FusedResiduals",
    "KerneltuneWarning",
    "LayerNorm",
    "RMSNorm",
    "Resolution",
    "TransformersPatch",
    "add_rms_norm",
    "add_rms_norm_quant",
    "config_for",
    "explain",
    "fuse_residuals",
    "hf_formula",
    "hf_offset",
    "layer_norm",
    "patch_model",
    "patch_transformers",
    "reset",
    "resolver",
    "rms_norm",
    "rms_norm_fake_quant",
    "rms_norm_group_quant",
    "rms_norm_quant",
    "unfuse_residuals",
    "unpatch_model",
    "unpatch_transformers",
]
