"""Layers for Hugging Face's `kernels` convention: ``kernels.kernelize`` with
``use_kernel_mapping``, and transformers' ``KernelConfig`` (``use_kernels=True``).

A `kernels` layer is a forward-only module class, no constructor and no members of its own:
`kernelize` binds its ``forward`` to each module of a model whose class is decorated with
``use_kernel_forward_from_hub(name)`` for a mapped name, so the forward reads that module's own
attributes. transformers decorates its RMSNorm classes with "RMSNorm" (Qwen3.5's with
"RMSNormZeroCentered"); `RMSNorm` below serves every such name:

    forward(self, hidden_states) = kerneltune.rms_norm(hidden_states, self.weight, eps,
                                                       offset, casting_mode)

with the eps attribute (``variance_epsilon`` or ``eps``), offset and rounding of the module's
class, probed once per class (`kerneltune.runtime.modules.probe_class`); a class that is not a plain
RMSNorm keeps its own forward.

`kernels` loads layers from a kernel repository, which `repository()` writes: a
``build/torch-universal`` variant whose module re-exports this one (`layers`), its
``metadata.json`` and digest. `mapping()` maps the layer names to it for ``use_kernel_mapping``,
`kernel_config()` for transformers' ``from_pretrained``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from kerneltune.runtime.modules import probe_class
from kerneltune.runtime.ops import rms_norm
from kerneltune.runtime.sources import cache_dir

#: The `kernels` layer names `RMSNorm` serves (transformers' decorators).
LAYER_NAMES = ("RMSNorm", "RMSNormZeroCentered")
#: The repository's variant: pure Python, for any backend.
VARIANT = "torch-universal"
KERNEL_ID = "kerneltune_layers"

_formulas: dict[type, tuple[float, str | None, str] | None] = {}


@torch.compiler.disable  # probed eagerly, once per class
def _probe(cls: type[nn.Module]) -> tuple[float, str | None, str] | None:
    """(offset, casting mode for `rms_norm`, eps attribute) of `cls`, or None."""
    probed = probe_class(cls)
    if probed is None:
        _formulas[cls] = None
        return None
    formula, eps_attribute = probed
    default = "llama" if formula.offset == 0.0 else "gemma"
    casting = None if formula.casting_mode == default else formula.casting_mode
    found = _formulas[cls] = (formula.offset, casting, eps_attribute)
    return found


class RMSNorm(nn.Module):
    """RMSNorm by kerneltune in the module's own formula and rounding (see the module doc)."""

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        cls = type(self)
        found = _formulas[cls] if cls in _formulas else _probe(cls)
        if found is None:
            return cls.forward(self, hidden_states)
        offset, casting, eps_attribute = found
        return rms_norm(hidden_states, self.weight, getattr(self, eps_attribute), offset, casting)


def repository(path: str | Path | None = None) -> Path:
    """A `kernels` repository of these layers at `path` (default: in KERNELTUNE_CACHE_DIR),
    written afresh; its path, what ``LocalLayerRepository`` and ``KernelConfig`` take."""
    # what `kernels` reads and checks a variant with
    from kernels._rust import Digest, DigestAlgorithm, Metadata

    root = Path(path) if path is not None else cache_dir() / "kernels-repository"
    variant = root / "build" / VARIANT
    variant.mkdir(parents=True, exist_ok=True)
    (variant / "__init__.py").write_text(
        '"""kerneltune\'s layers for `kernels`: see kerneltune.layers."""\n\n'
        "from kerneltune import layers\n\n"
        '__all__ = ["layers"]\n')
    digest = Digest.hash_variant(DigestAlgorithm.SHA256, variant)
    metadata = {
        # the id names the module `kernels` imports the variant as: not "kerneltune" itself
        "id": KERNEL_ID, "name": KERNEL_ID.replace("_", "-"), "version": 1, "license": "Apache-2.0",
        "python-depends": [], "backend": {"type": "cuda"},
        "digest": {"algorithm": "sha256", "files": digest.files},
    }
    text = json.dumps(metadata, indent=2) + "\n"
    Metadata.from_bytes(text.encode())  # what `kernels` will read: refused here, if at all
    (variant / "metadata.json").write_text(text)
    return root


def mapping(device: str = "cuda", path: str | Path | None = None) -> dict[str, Any]:
    """The kernel mapping of `LAYER_NAMES` to `RMSNorm` of `repository(path)` on `device`, for
    ``kernels.use_kernel_mapping``."""
    from kernels import LocalLayerRepository

    repo = repository(path)
    return {name: {device: LocalLayerRepository(repo_path=repo, layer_name="RMSNorm")}
            for name in LAYER_NAMES}


def kernel_config(layer_names: Sequence[str] = ("RMSNorm",), device: str = "cuda",
                  path: str | Path | None = None) -> Any:
    """transformers' ``KernelConfig`` mapping `layer_names` (each one the model registers) to
    `RMSNorm` of `repository(path)` on `device`, in its local-path form, for
    ``from_pretrained(..., use_kernels=True, kernel_config=...)``."""
    from transformers import KernelConfig

    spec = f"{repository(path)}:RMSNorm"
    return KernelConfig({name: {device: spec} for name in layer_names}, use_local_kernel=True)
