"""`fuse_residuals`: tiny Hugging Face models from their configs (random init, no download), whose
decoder layers add each residual and norm the sum in one `add_rms_norm` kernel.

The fused model's logits are the unfused kerneltune-patched model's bit for bit, in fp32 and
fp16: the kernel rounds ``x + residual`` to the dtype once, as torch's add does, and norms it with
the arithmetic of the RMSNorm kernel (on a GPU the two kernels' configs, and so their reduction
orders, may differ: there they are compared within a rounding step). Against the unpatched
Hugging Face model they agree as `patch_model`'s do.
"""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
from torch import nn

import kerneltune
from kerneltune.runtime import KerneltuneWarning, fusion
from kerneltune.runtime.fusion import fused_class, is_fused_class

from .conftest import DEVICE

transformers = pytest.importorskip("transformers")

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=128, max_position_embeddings=64,
            eos_token_id=None, pad_token_id=0)
CONFIGS = {
    "llama": transformers.LlamaConfig,
    "mistral": transformers.MistralConfig,
    "qwen2": transformers.Qwen2Config,
    "qwen3": transformers.Qwen3Config,
    "gemma": transformers.GemmaConfig,
    "gemma2": transformers.Gemma2Config,
    "gemma3": transformers.Gemma3TextConfig,
}
#: The norm each model type's layers fuse with the add before it.
FUSED_NORM = {kind: "post_attention_layernorm" for kind in CONFIGS} | {
    "gemma2": "pre_feedforward_layernorm", "gemma3": "pre_feedforward_layernorm"}
#: (offset, casting mode) of each model type's norms, as probed.
FORMULA = {kind: (0.0, "llama") for kind in CONFIGS} | {
    kind: (1.0, "gemma") for kind in ("gemma", "gemma2", "gemma3")}
IDS = (torch.arange(14).reshape(2, 7) * 5 % 128).to(DEVICE)


def build(kind: str, dtype: torch.dtype = torch.float32, config: type | None = None) -> nn.Module:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config((config or CONFIGS[kind])(**TINY))
    with torch.no_grad():  # norm weights away from their init, so 1 + w and w differ
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0 if "gemma" in kind else 1.0, 0.3)
    return model.to(DEVICE, dtype).eval()


def logits(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


def layers(model: nn.Module) -> list[nn.Module]:
    return list(model.model.layers)


def assert_same(got: torch.Tensor, expected: torch.Tensor) -> None:
    if DEVICE == "cpu":  # the interpreter: one default config, one reduction order
        assert torch.equal(got, expected), (got - expected).abs().max()
    else:
        torch.testing.assert_close(got, expected)


@pytest.fixture
def count_calls(monkeypatch) -> list[int]:
    """The number of `add_rms_norm` calls the fused forwards make."""
    calls = [0]
    real = fusion.add_rms_norm

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(fusion, "add_rms_norm", counted)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_fused_logits_are_the_unfused_ones(kind, dtype, count_calls):
    model = build(kind, dtype)
    hf = logits(model)
    kerneltune.patch_model(model)
    unfused = logits(model)
    original = type(layers(model)[0])

    handle = kerneltune.fuse_residuals(model)

    assert handle.fused == {f"model.layers.{i}": (FUSED_NORM[kind],) for i in range(2)}
    assert handle.skipped == {}
    for layer in layers(model):
        assert type(layer) is not original and isinstance(layer, original)
        assert type(layer).__name__ == original.__name__ and is_fused_class(type(layer))
    fused = logits(model)
    assert count_calls[0] == 2  # one fused add + norm per layer
    assert_same(fused, unfused)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-3, atol=2e-3)
    torch.testing.assert_close(fused, hf, **tol)
    found = model.model.layers[0].__dict__[fusion._STATE][FUSED_NORM[kind]]
    assert (found.offset, found.casting_mode or ("llama" if not found.offset else "gemma")
            ) == FORMULA[kind]

    handle.undo()
    assert [type(layer) for layer in layers(model)] == [original, original]
    assert all(fusion._STATE not in layer.__dict__ for layer in layers(model))
    assert_same(logits(model), unfused)
    assert count_calls[0] == 2  # not called once undone


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_hf_norms_are_fused_with_their_probed_formula(kind, count_calls):
    """Without `patch_model`, the Hugging Face norms' formulas are probed; fp16, where the
    roundings differ."""
    model = build(kind, torch.float16)
    expected = logits(model)
    with kerneltune.fuse_residuals(model) as handle:
        assert len(handle.fused) == 2
        got = logits(model)
        assert count_calls[0] == 2
    torch.testing.assert_close(got, expected, rtol=1e-3, atol=2e-3)
    assert not any(is_fused_class(type(layer)) for layer in layers(model))


@pytest.mark.parametrize("kind", ["llama", "qwen3", "gemma2", "gemma3"])
def test_generate_with_a_cache_gives_the_same_tokens(kind, count_calls):
    model = build(kind)
    kerneltune.patch_model(model)
    prompt = IDS[:1, :5]
    settings = dict(max_new_tokens=4, do_sample=False, use_cache=True, pad_token_id=0)
    with torch.no_grad():
        expected = model.generate(prompt, **settings)
        kerneltune.fuse_residuals(model)
        got = model.generate(prompt, **settings)
    assert got.shape == (1, 9)
    assert torch.equal(got, expected)
    assert count_calls[0] == 2 * 4  # prefill and three cached steps, two layers each


def test_the_installed_signature_is_kept():
    model = build("llama")
    original = type(layers(model)[0])
    fused = fused_class(original)
    assert inspect.signature(fused.forward) == inspect.signature(original.forward)
    hidden = torch.randn(1, 3, 64, device=DEVICE)
    rotary = model.model.rotary_emb(hidden, torch.arange(3, device=DEVICE)[None])
    layer = layers(model)[0]
    with torch.no_grad():
        expected = layer(hidden, position_embeddings=rotary)
        with kerneltune.fuse_residuals(model):
            got = layer(hidden, position_embeddings=rotary)
    assert type(got) is type(expected)  # a tensor, as this transformers returns
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["llama", "gemma2"])
def test_training_gradients_match(kind, count_calls):
    model = build(kind).train()
    kerneltune.patch_model(model)
    ids = IDS[:1]

    def grads() -> dict[str, torch.Tensor]:
        model.zero_grad()
        model(ids, labels=ids).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    expected = grads()
    with kerneltune.fuse_residuals(model):
        got = grads()
        assert count_calls[0] == 2
        # the checkpointing wrapper around forward is kept: the backward runs the layers again
        getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
        checkpointed = grads()
        assert count_calls[0] == 2 + 2 * 2
    assert got.keys() == expected.keys() and len(got) > 10
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(checkpointed[name], expected[name], rtol=1e-4, atol=1e-6)


def test_olmo2_rounding_is_kept():
    """A norm with OLMo2's formula (offset 0, the product in fp32) in a Llama layer, fp16."""
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm

    model = build("llama", torch.float16)
    for layer in layers(model):
        norm = Olmo2RMSNorm(64, eps=layer.post_attention_layernorm.variance_epsilon)
        norm.weight = layer.post_attention_layernorm.weight
        layer.post_attention_layernorm = norm
    hf = logits(model)
    kerneltune.patch_model(model)
    unfused = logits(model)
    handle = kerneltune.fuse_residuals(model)
    assert len(handle.fused) == 2
    found = model.model.layers[0].__dict__[fusion._STATE]["post_attention_layernorm"]
    assert (found.offset, found.casting_mode) == (0.0, "gemma")
    assert_same(logits(model), unfused)
    torch.testing.assert_close(logits(model), hf, rtol=1e-3, atol=2e-3)


def test_a_model_with_nothing_to_fuse_is_left_alone_and_listed():
    # OLMo2 norms after each add (add, keep the sum, then the MLP): nothing is add-then-norm
    model = build("olmo2", config=transformers.Olmo2Config)
    before = [type(layer) for layer in layers(model)]
    with pytest.warns(KerneltuneWarning, match="residuals not fused in 2 decoder layers"):
        handle = kerneltune.fuse_residuals(model)
    assert handle.fused == {}
    assert handle.skipped == {f"model.layers.{i}": "its forward has no residual add followed "
                              "by a norm of the sum" for i in range(2)}
    assert [type(layer) for layer in layers(model)] == before
    with pytest.warns(KerneltuneWarning, match="no decoder layers in Sequential"):
        assert kerneltune.fuse_residuals(nn.Sequential(nn.Linear(2, 2))).skipped == {}


def test_a_norm_with_hooks_or_swapped_runs_unfused_or_anew(count_calls):
    model = build("qwen2")
    kerneltune.patch_model(model)
    expected = logits(model)
    kerneltune.fuse_residuals(model)
    seen = []
    norm = model.model.layers[0].post_attention_layernorm
    hook = norm.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    assert_same(logits(model), expected)
    assert seen == [(2, 7, 64)] and count_calls[0] == 1  # the hooked norm ran as a module
    hook.remove()
    # a norm swapped after fusing (here back to Hugging Face's) is probed when first met
    layer = model.model.layers[1]
    layer.post_attention_layernorm = transformers.models.qwen2.modeling_qwen2.Qwen2RMSNorm(64)
    layer.post_attention_layernorm.weight = norm.weight
    logits(model)
    assert count_calls[0] == 1 + 2
    assert layer.__dict__[fusion._STATE]["post_attention_layernorm"].module is (
        layer.post_attention_layernorm)


def test_patch_transformers_builds_fused_layers():
    original = build("qwen3")
    expected = logits(original)
    qwen3 = transformers.models.qwen3.modeling_qwen3
    hf_class = qwen3.Qwen3DecoderLayer
    with kerneltune.patch_transformers(["qwen3"], fuse_residuals=True) as patch:
        assert qwen3.Qwen3DecoderLayer is not hf_class
        assert patch.fused_layers == [(qwen3, "Qwen3DecoderLayer", hf_class)]
        model = build("qwen3")
        assert all(is_fused_class(type(layer)) for layer in layers(model))
        assert all(type(layer.input_layernorm).kerneltune_formula == (0.0, "llama")
                   for layer in layers(model))
        torch.testing.assert_close(logits(model), expected, rtol=1e-5, atol=1e-5)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # fused already: listed, not warned about
            handle = kerneltune.fuse_residuals(model)
        assert handle.fused == {} and set(handle.skipped.values()) == {"fused already"}
    assert qwen3.Qwen3DecoderLayer is hf_class
    assert patch.fused_layers == [] and patch.replaced == []


def test_a_fused_model_compiles_in_one_graph(monkeypatch):
    monkeypatch.setenv("KERNELTUNE_COMPILE", "kernels")  # the fused kernel, not the formula
    model = build("llama")
    kerneltune.patch_model(model)
    expected = logits(model)
    kerneltune.fuse_residuals(model)
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, fullgraph=True)  # a break would raise
    torch.testing.assert_close(logits(compiled), expected, rtol=1e-5, atol=1e-5)
    (graph,) = graphs
    targets = [str(node.target) for node in graph.graph.nodes if node.op == "call_function"]
    assert targets.count("kerneltune.add_rms_norm.default") == 2, targets
