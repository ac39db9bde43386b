"""Every RMSNorm class of the installed transformers, replaced by `RMSNorm.from_hf`, gives its
module's fp16 output bit for bit (kernels under the interpreter, or on the GPU): each keeps its
own offset and rounding order, found by probing.

The classes are found by scanning ``transformers.models.*.modeling_*`` for classes whose name
ends in "RMSNorm". Those that are not a plain RMSNorm are left out, each for a reason the test
states: a constructor that is not ``(hidden_size, eps)``, no 1-D weight parameter (weightless
norms), more parameters or buffers, or a formula named in `OTHER_FORMULAS`.
"""

from __future__ import annotations

import importlib
import re
from functools import cache
from pathlib import Path

import pytest
import torch
from torch import nn

import kerneltune
from kerneltune.runtime.modules import hf_formula

from .conftest import DEVICE

transformers = pytest.importorskip("transformers")

HIDDEN = 48

#: Classes with one weight and an eps whose output is neither casting mode's, and why.
OTHER_FORMULAS = {
    "MuseSparkTextCenteredRMSNorm": "adds 1 to the weight in the weight's dtype (a rounding of "
                                    "1 + w) before the fp32 product",
    "MuseSparkTextInputScaledRMSNorm": "scales x by 1 + w before normalizing",
}


@cache
def rmsnorm_classes() -> dict[str, type[nn.Module]]:
    """Name -> class of every ``class ...RMSNorm(`` in a modeling module of transformers."""
    found = {}
    root = Path(transformers.__file__).parent / "models"
    for path in sorted(root.glob("*/modeling_*.py")):
        names = re.findall(r"^class (\w+RMSNorm)\(", path.read_text(), re.MULTILINE)
        if names:
            module = importlib.import_module(f"transformers.models.{path.parent.name}.{path.stem}")
            found.update((name, getattr(module, name)) for name in names)
    return found


def build(cls: type[nn.Module]) -> nn.Module | str:
    """An instance of hidden size `HIDDEN`, or why the class is not a plain RMSNorm."""
    try:
        module = cls(HIDDEN, eps=1e-5)
    except TypeError as e:
        return f"its constructor is not (hidden_size, eps): {e}"
    weight = getattr(module, "weight", None)
    params = [name for name, _ in module.named_parameters()]
    if not isinstance(weight, nn.Parameter) or weight.shape != (HIDDEN,):
        return f"no 1-D weight parameter (parameters {params})"
    if params != ["weight"] or any(True for _ in module.buffers()):
        return f"more than a weight: parameters {params}, buffers {list(module.buffers())}"
    return module


def test_every_rmsnorm_class_is_found():
    classes = rmsnorm_classes()
    assert len(classes) >= 50  # the scan found the zoo, not a handful
    for name in ("LlamaRMSNorm", "GemmaRMSNorm", "Olmo2RMSNorm", "Qwen3RMSNorm"):
        assert name in classes


def test_each_plain_rmsnorm_is_replaced_bit_for_bit_in_fp16():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, HIDDEN, generator=g).to(DEVICE, torch.float16)
    replaced, left_out = {}, {}
    for name, cls in sorted(rmsnorm_classes().items()):
        module = build(cls)
        if isinstance(module, str):
            left_out[name] = module
            continue
        with torch.no_grad():  # away from the init, where w and 1 + w coincide with x̂
            module.weight.copy_(0.5 + torch.rand(HIDDEN, generator=g))
        module = module.to(DEVICE, torch.float16)
        formula = hf_formula(module)
        if formula is None:
            assert name in OTHER_FORMULAS, f"{name}: no formula found"
            left_out[name] = OTHER_FORMULAS[name]
            continue
        ours = kerneltune.RMSNorm.from_hf(module)
        with torch.no_grad():
            expected, got = module(x), ours(x)
        assert got.dtype == expected.dtype == torch.float16, name
        assert torch.equal(got, expected), (
            f"{name} ({formula}): {(got != expected).sum()} of {got.numel()} values differ")
        replaced[name] = formula
    modes = {(f.offset, f.casting_mode) for f in replaced.values()}
    assert modes == {(0.0, "llama"), (1.0, "gemma"), (0.0, "gemma")}, modes
    assert replaced["LlamaRMSNorm"] == (0.0, "llama")
    assert replaced["GemmaRMSNorm"] == (1.0, "gemma")
    assert replaced["Olmo2RMSNorm"] == (0.0, "gemma")
    assert len(replaced) > 5 * len(left_out), left_out
