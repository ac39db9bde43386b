"""`RMSNorm`, a drop-in for Hugging Face's RMSNorm modules, and `patch_model`, which swaps them
into a loaded model in place.

Hugging Face's RMSNorm modules differ in two ways, told apart by probing a module with a test
weight (class names vary across the zoo, and the weights at init do not tell them apart: Llama's
start at 1 and scale by w, Gemma's start at 0 and scale by 1 + w):

- the scale, found by a float32 probe: ``w`` (offset 0) or ``1 + w`` (offset 1);
- where the product is rounded (the casting mode, Liger-Kernel's names), found by a half-precision
  probe whose inputs are chosen so that the two orders differ::

    Llama, Qwen2, Mistral, ...:  y = w · (x · r).to(x.dtype)                llama, offset 0
    Gemma, Gemma2, Qwen3-Next:   y = (x · r · (1 + w)) in fp32, cast once   gemma, offset 1
    OLMo2, GPT-OSS, Gemma3n:     y = (x · r · w) in fp32, cast once         gemma, offset 0

A module whose half-precision output is neither (another order, such as ``1 + w`` rounded to
the weight's dtype first) is left alone.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn
from torch.func import functional_call

from kerneltune.runtime import native
from kerneltune.runtime.ops import FP32_PRODUCT_OFFSET, kernel_offset, rms_norm

_PROBE_ROWS = 3
#: Seeds tried for a half-precision probe whose two rounding orders differ somewhere.
_PROBE_SEEDS = 8


class Formula(NamedTuple):
    """What an RMSNorm module computes: its scale's offset and its casting mode."""

    offset: float
    casting_mode: str


def _eps_of(module: nn.Module) -> float | None:
    for name in ("variance_epsilon", "eps"):
        eps = getattr(module, name, None)
        if isinstance(eps, int | float) and not isinstance(eps, bool) and math.isfinite(eps):
            return float(eps)
    return None


def _looks_like_rmsnorm(module: nn.Module) -> bool:
    """An HF norm by its class name, not one computed by kerneltune already (`RMSNorm`, or a
    class `patch_transformers` made)."""
    name = type(module).__name__.lower()
    return (("rmsnorm" in name or name == "t5layernorm") and not isinstance(module, RMSNorm)
            and not hasattr(type(module), "kerneltune_formula"))


def _probe(module: nn.Module, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
    """The module's output on `x` with `w` for its weight (the module is not touched), or None
    where its forward cannot run on them."""
    try:
        with torch.no_grad():
            out = functional_call(module, {"weight": w}, (x,))
    except Exception:  # a forward that cannot run on the probe is not one we know
        return None
    return out.detach() if isinstance(out, torch.Tensor) and out.shape == x.shape else None


def _offset(module: nn.Module, weight: torch.Tensor, eps: float) -> float | None:
    """0.0 or 1.0 where the module scales x̂ by w or 1 + w (float32 probe), else None."""
    n = weight.numel()
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(_PROBE_ROWS, n, generator=g, dtype=torch.float64)
    w = 0.5 + torch.rand(n, generator=g, dtype=torch.float64)
    out = _probe(module, x.to(weight.device, torch.float32), w.to(weight.device, torch.float32))
    if out is None:
        return None
    out = out.double().cpu()
    xhat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    for offset in (0.0, 1.0):
        if torch.allclose(out, xhat * (offset + w), rtol=1e-4, atol=1e-5):
            return offset
    return None


def _casting_mode(module: nn.Module, weight: torch.Tensor, eps: float, offset: float
                  ) -> str | None:
    """The casting mode whose fp16 result the module gives bit for bit, on inputs where the
    modes' results differ (llama where none such is found: then the modes agree); None where
    it gives neither."""
    n, device = weight.numel(), weight.device
    candidates = {"gemma": offset or FP32_PRODUCT_OFFSET}
    if offset == 0.0:
        candidates["llama"] = 0.0
    for seed in range(_PROBE_SEEDS):
        g = torch.Generator(device="cpu").manual_seed(seed)
        x = torch.randn(_PROBE_ROWS, n, generator=g).to(device, torch.float16)
        w = (0.5 + torch.rand(n, generator=g)).to(device, torch.float16)
        results = {mode: native.rms_norm(x, w, eps, k) for mode, k in candidates.items()}
        if len(candidates) > 1 and torch.equal(*results.values()):
            continue  # the orders agree on these inputs: they tell nothing
        out = _probe(module, x, w)
        if out is None:
            return None
        return next((mode for mode, y in results.items() if torch.equal(out, y)), None)
    return "llama"


def hf_formula(module: nn.Module) -> Formula | None:
    """The offset and casting mode of a Hugging Face RMSNorm module, None for anything else
    (another formula or rounding, extra parameters or buffers, no 1-D weight, no eps).

    Decided by running the module on probe inputs with a probe weight substituted
    (`torch.func.functional_call`, the module is not touched); on the meta device, where nothing
    runs, on a small instance of its class built on the CPU (`probe_class`).
    """
    weight = getattr(module, "weight", None)
    eps = _eps_of(module)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or eps is None:
        return None
    if sum(1 for _ in module.parameters()) != 1 or any(True for _ in module.buffers()):
        return None
    if weight.is_meta:
        probed = probe_class(type(module))
        return None if probed is None else probed[0]
    offset = _offset(module, weight, eps)
    if offset is None:
        return None
    mode = _casting_mode(module, weight, eps, offset)
    return None if mode is None else Formula(offset, mode)


#: Hidden size of the instance a class is probed on.
_PROBE_HIDDEN = 16


def _eps_attribute(module: nn.Module) -> str:
    return "variance_epsilon" if hasattr(module, "variance_epsilon") else "eps"


def probe_class(cls: type[nn.Module]) -> tuple[Formula, str] | None:
    """The formula of the instances of an HF norm class and the attribute holding their eps,
    found on a small instance built on the CPU; None where its constructor is not
    ``(hidden_size, eps=...)`` or `hf_formula` does not know the instance."""
    try:
        with torch.device("cpu"):  # not the meta device a model may be built under
            module = cls(_PROBE_HIDDEN, eps=1e-5)
    except Exception:  # a constructor other than (hidden_size, eps=...)
        return None
    formula = hf_formula(module)
    return None if formula is None else (formula, _eps_attribute(module))


def hf_offset(module: nn.Module) -> float | None:
    """0.0 for a Llama- or OLMo2-style RMSNorm module, 1.0 for a Gemma-style one, None for
    anything else (`hf_formula`)."""
    formula = hf_formula(module)
    return None if formula is None else formula.offset


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension with a tuned Triton kernel.

    Same constructor, parameter (`weight`), attribute (`variance_epsilon`) and state dict as
    Hugging Face's `LlamaRMSNorm`; `offset=1.0` gives Gemma's ``x̂ · (1 + w)`` (then `weight`
    starts at zero, as in `GemmaRMSNorm`); `casting_mode` says where the product is rounded
    (`kerneltune.rms_norm`; by default llama at offset 0, gemma otherwise; 'gemma' at offset 0
    is OLMo2's). The output has the input's dtype.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, offset: float = 0.0,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                 casting_mode: str | None = None):
        super().__init__()
        init = torch.zeros if offset else torch.ones
        self.weight = nn.Parameter(init(hidden_size, device=device, dtype=dtype))
        self.variance_epsilon = eps
        self._set_formula(float(offset), casting_mode)

    def _set_formula(self, offset: float, casting_mode: str | None) -> None:
        default = "llama" if offset == 0.0 else "gemma"
        mode = default if casting_mode is None else casting_mode
        if mode != default:  # refused here, not at the first call
            kernel_offset(offset, mode, None)
        self.offset, self.casting_mode = offset, mode
        # The default needs no mapping at each call (the calls' host time counts).
        self._casting = None if mode == default else mode

    @property
    def eps(self) -> float:
        """Gemma's name for `variance_epsilon`."""
        return self.variance_epsilon

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden_states, self.weight, self.variance_epsilon, self.offset,
                        self._casting)

    def extra_repr(self) -> str:
        extra = f", offset={self.offset}" if self.offset else ""
        if self._casting is not None:
            extra += f", casting_mode={self.casting_mode!r}"
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}{extra}"

    @classmethod
    def from_hf(cls, module: nn.Module) -> RMSNorm:
        """The equivalent of a Hugging Face RMSNorm module, sharing its weight `Parameter`."""
        return cls._replacing(module, hf_formula(module))

    @classmethod
    def _replacing(cls, module: nn.Module, formula: Formula | None) -> RMSNorm:
        """`from_hf` with the module's formula found already."""
        if formula is None:
            raise TypeError(
                f"{type(module).__name__} is not an RMSNorm kerneltune can replace: it needs one "
                "1-D `weight`, an `eps` or `variance_epsilon`, and Llama's, Gemma's or OLMo2's "
                "formula and rounding"
            )
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.weight = module.weight
        new.variance_epsilon = _eps_of(module)
        new._set_formula(formula.offset, formula.casting_mode)
        new.train(module.training)
        return new


def patch_model(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Swap every Hugging Face RMSNorm module of `model` for an `RMSNorm`, in place.

    Weights are shared (the same `Parameter` objects), so the state dict, optimizers and tied
    weights are unaffected. Each keeps its module's offset and rounding (`hf_formula`). Returns
    ``(qualified name, replaced module)`` per swap, what `unpatch_model` takes to undo it.
    Modules with another formula or rounding are left alone.
    """
    replacements: dict[int, RMSNorm] = {}
    for module in model.modules():
        if id(module) not in replacements and _looks_like_rmsnorm(module):
            formula = hf_formula(module)
            if formula is not None:
                replacements[id(module)] = RMSNorm._replacing(module, formula)
    patched: list[tuple[str, nn.Module]] = []
    for parent_name, parent in list(model.named_modules(remove_duplicate=False)):
        for attr, child in list(parent._modules.items()):
            if child is not None and id(child) in replacements:
                setattr(parent, attr, replacements[id(child)])
                patched.append((f"{parent_name}.{attr}" if parent_name else attr, child))
    return patched


def unpatch_model(model: nn.Module, patched: list[tuple[str, nn.Module]]) -> None:
    """Put back the modules `patch_model` replaced."""
    for name, old in patched:
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, old)
