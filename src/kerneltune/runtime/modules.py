"""`RMSNorm`, a drop-in for Hugging Face's RMSNorm modules, and `patch_model`, which swaps them
into a loaded model in place.

Hugging Face has two RMSNorm semantics, told apart by probing a module with a test weight
(class names vary across the zoo, and the weights at init do not tell them apart: Llama's
start at 1 and scale by w, Gemma's start at 0 and scale by 1 + w):

    Llama, Qwen2, Mistral, ...:  y = w · (x · r).to(x.dtype)                 offset 0
    Gemma, Gemma2, Gemma3, ...:  y = (x · r · (1 + w)) in fp32, cast once     offset 1
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.func import functional_call

from kerneltune.runtime.ops import rms_norm

_PROBE_ROWS = 3


def _eps_of(module: nn.Module) -> float | None:
    for name in ("variance_epsilon", "eps"):
        eps = getattr(module, name, None)
        if isinstance(eps, int | float) and not isinstance(eps, bool) and math.isfinite(eps):
            return float(eps)
    return None


def _looks_like_rmsnorm(module: nn.Module) -> bool:
    name = type(module).__name__.lower()
    return ("rmsnorm" in name or name == "t5layernorm") and not isinstance(module, RMSNorm)


def hf_offset(module: nn.Module) -> float | None:
    """0.0 for a Llama-style RMSNorm module, 1.0 for a Gemma-style one, None for anything else
    (another formula, extra parameters, no weight).

    Decided by running the module on a probe input with a probe weight substituted
    (`torch.func.functional_call`, the module is not touched); on the meta device, where nothing
    runs, by the class name.
    """
    weight = getattr(module, "weight", None)
    eps = _eps_of(module)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or eps is None:
        return None
    if sum(1 for _ in module.parameters()) != 1 or any(True for _ in module.buffers()):
        return None
    if weight.is_meta:
        return 1.0 if "gemma" in type(module).__name__.lower() else 0.0
    n = weight.numel()
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(_PROBE_ROWS, n, generator=g, dtype=torch.float64)
    w = 0.5 + torch.rand(n, generator=g, dtype=torch.float64)
    try:
        with torch.no_grad():
            out = functional_call(
                module, {"weight": w.to(weight.device, torch.float32)},
                (x.to(weight.device, torch.float32),),
            )
    except Exception:  # a forward that cannot run on the probe is not one we know
        return None
    if not isinstance(out, torch.Tensor) or out.shape != x.shape:
        return None
    out = out.detach().double().cpu()
    xhat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    for offset in (0.0, 1.0):
        if torch.allclose(out, xhat * (offset + w), rtol=1e-4, atol=1e-5):
            return offset
    return None


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension with a tuned Triton kernel.

    Same constructor, parameter (`weight`), attribute (`variance_epsilon`) and state dict as
    Hugging Face's `LlamaRMSNorm`; `offset=1.0` gives Gemma's ``x̂ · (1 + w)`` (then `weight`
    starts at zero, as in `GemmaRMSNorm`). The output has the input's dtype.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, offset: float = 0.0,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        init = torch.zeros if offset else torch.ones
        self.weight = nn.Parameter(init(hidden_size, device=device, dtype=dtype))
        self.variance_epsilon = eps
        self.offset = float(offset)

    @property
    def eps(self) -> float:
        """Gemma's name for `variance_epsilon`."""
        return self.variance_epsilon

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden_states, self.weight, self.variance_epsilon, self.offset)

    def extra_repr(self) -> str:
        extra = f", offset={self.offset}" if self.offset else ""
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}{extra}"

    @classmethod
    def from_hf(cls, module: nn.Module) -> RMSNorm:
        """The equivalent of a Hugging Face RMSNorm module, sharing its weight `Parameter`."""
        offset = hf_offset(module)
        if offset is None:
            raise TypeError(
                f"{type(module).__name__} is not an RMSNorm kerneltune can replace: it needs one "
                "1-D `weight`, an `eps` or `variance_epsilon`, and Llama's or Gemma's formula"
            )
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.weight = module.weight
        new.variance_epsilon = _eps_of(module)
        new.offset = offset
        new.train(module.training)
        return new


def patch_model(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Swap every Hugging Face RMSNorm module of `model` for an `RMSNorm`, in place.

    Weights are shared (the same `Parameter` objects), so the state dict, optimizers and tied
    weights are unaffected. Returns ``(qualified name, replaced module)`` per swap, what
    `unpatch_model` takes to undo it. Modules with another formula are left alone.
    """
    replacements: dict[int, RMSNorm] = {}
    for module in model.modules():
        if id(module) not in replacements and _looks_like_rmsnorm(module):
            offset = hf_offset(module)
            if offset is not None:
                replacements[id(module)] = RMSNorm.from_hf(module)
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
