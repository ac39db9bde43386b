"""kerneltune's layers under Hugging Face's `kernels`: `kernelize` with a local layer repository
swaps the norms' forward to kerneltune's, with the logits unchanged; transformers' KernelConfig
takes the repository in its local-path form."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from torch import nn

kernels = pytest.importorskip("kernels")
transformers = pytest.importorskip("transformers")

from transformers.models.gemma.modeling_gemma import GemmaRMSNorm  # noqa: E402

from kerneltune import layers  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def tiny_llama() -> nn.Module:
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=64))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.3)
    return model.to(DEVICE).eval()


def kernelize(model: nn.Module, path) -> nn.Module:
    mapping = layers.mapping(DEVICE, path)
    with kernels.use_kernel_mapping(mapping, inherit_mapping=False):
        return kernels.kernelize(model, mode=kernels.Mode.INFERENCE, device=DEVICE)


def test_kernelize_swaps_a_llamas_norms_to_kerneltune_with_the_same_logits(tmp_path):
    model = tiny_llama()
    ids = torch.arange(14, device=DEVICE).reshape(2, 7)
    with torch.no_grad():
        expected = model(ids).logits
    kernelize(model, tmp_path / "repo")
    norms = [m for m in model.modules() if type(m).__name__ == "LlamaRMSNorm"]
    assert len(norms) == 2 * 2 + 1
    for norm in norms:
        assert norm.forward.__func__ is layers.RMSNorm.forward
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, expected, rtol=1e-5, atol=1e-5)


@kernels.use_kernel_forward_from_hub("RMSNormZeroCentered")
class ZeroCenteredRMSNorm(GemmaRMSNorm):
    """Gemma's formula (1 + w, all in fp32) under Qwen3.5's layer name."""


def test_the_layer_keeps_each_classs_formula_bit_for_bit(tmp_path):
    norm = ZeroCenteredRMSNorm(48, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_(0.0, 0.5)
    model = nn.Sequential(norm).to(DEVICE, torch.float16)
    x = torch.randn(3, 48, generator=torch.Generator().manual_seed(0)).to(DEVICE, torch.float16)
    with torch.no_grad():
        expected = model(x)
    kernelize(model, tmp_path / "repo")
    assert norm.forward.__func__ is layers.RMSNorm.forward
    with torch.no_grad():
        assert torch.equal(model(x), expected)
    assert layers._formulas[ZeroCenteredRMSNorm][:2] == (1.0, None)  # offset 1, gemma rounding


def test_the_repository_is_a_kernels_repository(tmp_path):
    repo = layers.repository(tmp_path / "repo")
    variant = repo / "build" / layers.VARIANT
    metadata = json.loads((variant / "metadata.json").read_text())
    assert metadata["id"] == layers.KERNEL_ID and metadata["digest"]["files"]
    # loaded by `kernels` itself, in a fresh interpreter: its layers are this module's
    code = ("import sys, kernels, kerneltune.layers as layers; "
            f"k = kernels.get_local_kernel(__import__('pathlib').Path({str(repo)!r})); "
            "assert k.layers is layers and sys.modules['kerneltune'].__file__ != k.__file__; "
            "print(k.layers.RMSNorm.__module__)")
    out = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", code],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "kerneltune.layers"


def test_kernel_config_takes_the_local_path_form(tmp_path):
    from transformers.utils.kernel_config import add_to_mapping_local

    model = tiny_llama()
    config = layers.kernel_config(path=tmp_path / "repo")
    config.sanitize_kernel_mapping(model)  # the form transformers checks before it loads
    spec = config.kernel_mapping["RMSNorm"]["cuda"]
    assert spec == f"{tmp_path / 'repo'}:RMSNorm"
    # what KernelConfig makes of it for the model's device (on `DEVICE` here, since
    # transformers maps no CPU kernels), given to `kernelize`
    mapping: dict = {}
    add_to_mapping_local("RMSNorm", "cuda", spec, kernels.Mode.INFERENCE, mapping)
    repo = mapping["RMSNorm"]["cuda"][kernels.Mode.INFERENCE]
    assert repo.load() is layers.RMSNorm
    with kernels.use_kernel_mapping({"RMSNorm": {DEVICE: repo}}, inherit_mapping=False):
        kernels.kernelize(model, mode=kernels.Mode.INFERENCE, device=DEVICE)
    assert model.model.norm.forward.__func__ is layers.RMSNorm.forward
