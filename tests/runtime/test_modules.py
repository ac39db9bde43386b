"""`RMSNorm` as a drop-in for Hugging Face's modules, and `patch_model` on tiny random models
(no download) giving the same logits as the unpatched model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import kerneltune
from kerneltune.runtime import hf_formula, hf_offset, unpatch_model

from .conftest import DEVICE

transformers = pytest.importorskip("transformers")

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)


def tiny_model(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "llama":
        config = transformers.LlamaConfig(**TINY)
        model = transformers.LlamaForCausalLM(config)
    elif kind == "gemma":
        config = transformers.GemmaConfig(**TINY, head_dim=16)
        model = transformers.GemmaForCausalLM(config)
    elif kind == "gemma2":
        config = transformers.Gemma2Config(**TINY, head_dim=16)
        model = transformers.Gemma2ForCausalLM(config)
    elif kind == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**TINY))
    elif kind == "mistral":
        model = transformers.MistralForCausalLM(transformers.MistralConfig(**TINY))
    elif kind == "olmo2":
        model = transformers.Olmo2ForCausalLM(transformers.Olmo2Config(**TINY))
    else:
        raise ValueError(kind)
    with torch.no_grad():  # norm weights away from their init, so 1 + w and w differ
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0 if "gemma" in kind else 1.0, 0.3)
    return model.to(DEVICE).eval()


def norm_modules(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if "rmsnorm" in type(m).__name__.lower()]


@pytest.mark.parametrize("kind,offset,casting_mode", [
    ("llama", 0.0, "llama"), ("gemma", 1.0, "gemma"), ("gemma2", 1.0, "gemma"),
    ("qwen2", 0.0, "llama"), ("mistral", 0.0, "llama"), ("olmo2", 0.0, "gemma")])
def test_patch_model_keeps_the_logits(kind, offset, casting_mode):
    model = tiny_model(kind)
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    with torch.no_grad():
        expected = model(ids).logits
    hf_norms = norm_modules(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}

    patched = kerneltune.patch_model(model)

    assert sorted(name for name, _ in patched) == sorted(hf_norms)
    assert len(patched) >= 2 * 2 + 1
    for name, old in patched:
        new = model.get_submodule(name)
        assert isinstance(new, kerneltune.RMSNorm) and new.offset == offset
        assert new.casting_mode == casting_mode
        assert new.weight is old.weight  # shared, not copied
    assert model.state_dict().keys() == state.keys()
    with torch.no_grad():
        got = model(ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert kerneltune.patch_model(model) == []  # nothing left to patch

    unpatch_model(model, patched)
    assert norm_modules(model) == hf_norms


def test_patched_model_trains_like_the_original():
    model = tiny_model("llama").train()
    ids = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    model(ids, labels=ids).loss.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters() if "norm" in n}
    model.zero_grad()
    kerneltune.patch_model(model)
    model(ids, labels=ids).loss.backward()
    for n, g in expected.items():
        torch.testing.assert_close(dict(model.named_parameters())[n].grad, g,
                                   rtol=1e-4, atol=1e-6)


def test_rmsnorm_is_a_drop_in_for_llama_rmsnorm():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    hf, ours = LlamaRMSNorm(64, eps=1e-5), kerneltune.RMSNorm(64, eps=1e-5)
    assert ours.state_dict().keys() == hf.state_dict().keys()
    assert ours.extra_repr() == hf.extra_repr() and ours.variance_epsilon == 1e-5
    with torch.no_grad():
        hf.weight.normal_(1.0, 0.3)
    ours.load_state_dict(hf.state_dict())
    x = torch.randn(3, 4, 64, dtype=torch.bfloat16, device=DEVICE)
    with torch.no_grad():
        hf.to(DEVICE, torch.bfloat16)
        ours.to(DEVICE, torch.bfloat16)
        y = ours(x)
        # bf16 within one rounding of HF's (on a GPU bit-equal; the interpreter truncates
        # the kernel's intermediate bf16 cast)
        torch.testing.assert_close(y, hf(x))
        assert y.dtype == torch.bfloat16
    hf.load_state_dict(ours.state_dict())


def test_from_hf_detects_gemma_and_shares_the_weight():
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    hf = GemmaRMSNorm(32, eps=1e-6).to(DEVICE)
    with torch.no_grad():
        hf.weight.normal_(0.0, 0.3)
    ours = kerneltune.RMSNorm.from_hf(hf)
    assert ours.offset == 1.0 and ours.weight is hf.weight and ours.eps == 1e-6
    assert "offset=1.0" in ours.extra_repr()
    x = torch.randn(5, 32, device=DEVICE)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(x), rtol=1e-5, atol=1e-6)
    fresh = kerneltune.RMSNorm(32, offset=1.0)
    assert torch.equal(fresh.weight, torch.zeros(32))  # Gemma's zero init


def test_semantics_are_probed_not_guessed_from_weights():
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    # at init both compute x̂: only a probe with another weight tells them apart
    assert hf_offset(LlamaRMSNorm(16)) == 0.0
    assert hf_offset(GemmaRMSNorm(16)) == 1.0
    assert hf_offset(nn.LayerNorm(16)) is None
    with pytest.raises(TypeError, match="LayerNorm is not an RMSNorm kerneltune can replace"):
        kerneltune.RMSNorm.from_hf(nn.LayerNorm(16))

    class ScaledRMSNorm(nn.Module):  # another formula with the same attributes
        def __init__(self) -> None:
            super().__init__()
            self.weight, self.eps = nn.Parameter(torch.ones(16)), 1e-6

        def forward(self, x):
            return 2 * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    holder = nn.Sequential(ScaledRMSNorm())
    assert kerneltune.patch_model(holder) == []


def test_shared_module_is_replaced_everywhere():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(16)
    model = nn.ModuleDict({"a": norm, "b": nn.Sequential(norm)})
    patched = kerneltune.patch_model(model)
    assert sorted(n for n, _ in patched) == ["a", "b.0"]
    assert model["a"] is model["b"][0] and isinstance(model["a"], kerneltune.RMSNorm)


def test_olmo2_rounding_is_kept_and_shown():
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm

    hf = Olmo2RMSNorm(32, eps=1e-6)
    with torch.no_grad():
        hf.weight.normal_(1.0, 0.3)
    hf = hf.to(DEVICE, torch.float16)
    ours = kerneltune.RMSNorm.from_hf(hf)
    assert (ours.offset, ours.casting_mode) == (0.0, "gemma")
    assert ours.extra_repr() == "(32,), eps=1e-06, casting_mode='gemma'"
    x = torch.randn(4, 32, device=DEVICE).half()
    with torch.no_grad():
        assert torch.equal(ours(x), hf(x))
        # the Llama rounding gives other values on these inputs
        assert not torch.equal(kerneltune.rms_norm(x, hf.weight, 1e-6), hf(x))


def test_on_the_meta_device_the_class_is_probed():
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm

    expected = {LlamaRMSNorm: (0.0, "llama"), GemmaRMSNorm: (1.0, "gemma"),
                Olmo2RMSNorm: (0.0, "gemma")}
    for cls, formula in expected.items():
        with torch.device("meta"):
            module = cls(64, eps=1e-6)
        assert module.weight.is_meta and hf_formula(module) == formula
