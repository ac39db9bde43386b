"""`patch_transformers`: tiny models built from transformers configs (random init, no
download) with kerneltune's norms from the start, giving the unpatched model's logits; undo puts
the original classes back."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import kerneltune
from kerneltune.runtime.hf import TransformersPatch

from .conftest import DEVICE

transformers = pytest.importorskip("transformers")

from transformers.models.gemma import modeling_gemma  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402
from transformers.models.olmo2 import modeling_olmo2  # noqa: E402
from transformers.models.qwen3 import modeling_qwen3  # noqa: E402

TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, vocab_size=64, max_position_embeddings=32)
CONFIGS = {
    "llama": (transformers.LlamaConfig, modeling_llama.LlamaRMSNorm),
    "qwen3": (transformers.Qwen3Config, modeling_qwen3.Qwen3RMSNorm),
    "gemma": (transformers.GemmaConfig, modeling_gemma.GemmaRMSNorm),
    "olmo2": (transformers.Olmo2Config, modeling_olmo2.Olmo2RMSNorm),
}


def build(kind: str, state: dict | None = None) -> nn.Module:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[kind][0](**TINY))
    if state is None:
        with torch.no_grad():  # norm weights away from their init
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.normal_(0.0 if kind == "gemma" else 1.0, 0.3)
    else:
        model.load_state_dict(state)
    return model.to(DEVICE).eval()


def norm_classes(model: nn.Module) -> set[type]:
    return {type(m) for m in model.modules() if type(m).__name__.endswith("RMSNorm")}


def logits(model: nn.Module) -> torch.Tensor:
    ids = torch.arange(14, device=DEVICE).reshape(2, 7) % 64
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_models_built_after_the_patch_run_kerneltune_with_the_same_logits(kind):
    original = build(kind)
    expected = logits(original)
    hf_class = CONFIGS[kind][1]
    with kerneltune.patch_transformers([kind]) as patch:
        patched = build(kind, original.state_dict())
        (cls,) = norm_classes(patched)
        assert cls is not hf_class and issubclass(cls, hf_class)
        assert cls.__name__ == hf_class.__name__ and cls.forward is not hf_class.forward
        assert patched.state_dict().keys() == original.state_dict().keys()
        assert f"{hf_class.__module__}.{hf_class.__name__}" in patch.classes
        torch.testing.assert_close(logits(patched), expected, rtol=1e-5, atol=1e-5)
        assert kerneltune.patch_model(patched) == []  # nothing left to swap
    assert norm_classes(build(kind)) == {hf_class}  # undone


def test_from_pretrained_builds_kerneltune_norms(tmp_path):
    original = build("qwen3").cpu()
    original.save_pretrained(tmp_path)
    patch = kerneltune.patch_transformers(["qwen3"])
    try:
        loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).to(DEVICE).eval()
    finally:
        kerneltune.unpatch_transformers(patch)
    (cls,) = norm_classes(loaded)
    assert cls.kerneltune_formula == (0.0, "llama")
    torch.testing.assert_close(logits(loaded), logits(original.to(DEVICE)), rtol=1e-5, atol=1e-5)
    assert modeling_qwen3.Qwen3RMSNorm is CONFIGS["qwen3"][1]


def test_all_model_types_and_undo():
    before = {name: getattr(modeling_llama, name) for name in dir(modeling_llama)}
    patch = kerneltune.patch_transformers()
    try:
        classes = patch.classes
        assert len(classes) > 100
        assert classes["transformers.models.olmo2.modeling_olmo2.Olmo2RMSNorm"] == (0.0, "gemma")
        assert classes["transformers.models.gemma.modeling_gemma.GemmaRMSNorm"] == (1.0, "gemma")
        # left alone, with a reason: e.g. a norm without weight
        assert any("Unweighted" in name for name in patch.left_alone)
        # an instance built without its weight keeps its own forward
        from transformers.models.gemma3n import modeling_gemma3n

        unscaled = modeling_gemma3n.Gemma3nRMSNorm(16, with_scale=False)
        x = torch.randn(2, 16)
        torch.testing.assert_close(unscaled(x), x * torch.rsqrt(x.pow(2).mean(-1, True) + 1e-6))
    finally:
        patch.undo()
    assert {name: getattr(modeling_llama, name) for name in dir(modeling_llama)} == before
    assert patch.replaced == []


def test_an_unknown_model_type_is_refused():
    with pytest.raises(ValueError, match=r"unknown model types \['no_such_model'\]"):
        kerneltune.patch_transformers(["llama", "no_such_model"])
    assert isinstance(kerneltune.patch_transformers([]), TransformersPatch)


def forward_graph(model: nn.Module) -> list[str]:
    """The aten ops, in order, of the forward graph `torch.compile` makes of a bf16 model."""
    from torch._dynamo.backends.common import aot_autograd

    ops: list[str] = []

    def record(gm: torch.fx.GraphModule, _inputs: list) -> Callable:
        ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model.to(torch.bfloat16), backend=aot_autograd(fw_compiler=record))
    with torch.no_grad():
        compiled(torch.arange(7, device=DEVICE)[None] % 64)
    torch._dynamo.reset()
    return ops


@pytest.mark.parametrize("kind", ["llama", "qwen3", "gemma"])
def test_a_patched_model_compiles_to_the_graph_of_the_unpatched_one(kind, monkeypatch):
    """Under torch.compile the norms (and the residual adds fused into them) trace their torch
    formula, written as transformers writes it: Inductor gets the very same graph, so patching
    costs a compiled model nothing. (OLMo2's formula is traced with its fp32 offset, one add
    more.)"""
    monkeypatch.delenv("KERNELTUNE_COMPILE", raising=False)
    original = build(kind)
    expected = forward_graph(original)
    patched = build(kind, original.state_dict())
    assert kerneltune.patch_model(patched)
    assert forward_graph(patched) == expected
    with kerneltune.patch_transformers([kind], fuse_residuals=True):
        fused = build(kind, original.state_dict())
        assert forward_graph(fused) == expected
