"""`patch_transformers`: Hugging Face models built with kerneltune's RMSNorm from the start.

`patch_model` swaps the norm modules of a model already built; `patch_transformers` swaps the
norm classes in transformers' modeling modules before a model is built, so that
``from_pretrained``, ``from_config`` and plain constructors make kerneltune modules (and a
model on the meta device, which no probe can run, gets them too).

Each RMSNorm class (a class of a ``transformers.models.<type>.modeling_*`` module whose name
ends in "RMSNorm", defined there or imported) is probed once, on a small instance of its own
(`probe_class`: its offset and rounding). A class that is a plain RMSNorm is replaced, in every
modeling module that names it, by a subclass of its own that keeps its name, constructor,
parameters, init and state dict and runs `kerneltune.rms_norm` in its forward with the class's
offset and casting mode. Classes the probe does not recognise, or whose constructor is not
``(hidden_size, eps=...)``, stay as they are.

With ``fuse_residuals=True``, each decoder layer class of those modules is replaced too, by its
subclass that adds each residual and norms the sum in one `add_rms_norm` kernel
(`kerneltune.runtime.fusion`); layer classes with nothing to fuse stay, listed in `left_alone`.

transformers is imported only when these are called.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import MethodType, ModuleType
from typing import Any

import torch
from torch import nn

from kerneltune.runtime.fusion import fused_class, is_fused_class
from kerneltune.runtime.modules import Formula, probe_class
from kerneltune.runtime.ops import rms_norm


def modeling_modules(model_types: Sequence[str] | None = None
                     ) -> tuple[list[ModuleType], dict[str, str]]:
    """The modeling modules of the installed transformers: all of them, or those of the
    named model types (a model type as a config names it, e.g. "llama", "qwen3"); and those
    that cannot be imported here (a dependency missing), with the reason."""
    import transformers.models
    from transformers.models.auto.configuration_auto import (
        CONFIG_MAPPING_NAMES,
        model_type_to_module_name,
    )

    if model_types is None:
        folders = sorted(m.name for m in pkgutil.iter_modules(transformers.models.__path__))
    else:
        unknown = [t for t in model_types if t not in CONFIG_MAPPING_NAMES]
        if unknown:
            raise ValueError(f"unknown model types {unknown}: transformers "
                             f"{transformers.__version__} names none such")
        folders = sorted({model_type_to_module_name(t) for t in model_types})
    modules, unimportable = [], {}
    for folder in folders:
        package = f"transformers.models.{folder}"
        for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
            if info.name.startswith("modeling_") and not info.name.startswith(
                    ("modeling_tf_", "modeling_flax_")):
                name = f"{package}.{info.name}"
                try:
                    modules.append(importlib.import_module(name))
                except ImportError as e:
                    unimportable[name] = f"cannot be imported here: {e}"
    return modules, unimportable


def _plain(module: nn.Module, eps_attribute: str) -> bool:
    """Whether an instance is built as the probed one was: one 1-D weight parameter, no
    buffers, a numeric eps (a constructor argument may build another, such as no weight)."""
    weight = getattr(module, "weight", None)
    eps = getattr(module, eps_attribute, None)
    return (isinstance(weight, nn.Parameter) and weight.dim() == 1
            and isinstance(eps, int | float) and not isinstance(eps, bool)
            and sum(1 for _ in module.parameters()) == 1
            and not any(True for _ in module.buffers()))


def kerneltune_class(cls: type[nn.Module], formula: Formula, eps_attribute: str
                     ) -> type[nn.Module]:
    """A subclass of `cls` (same name, constructor, parameters and state dict) whose forward
    is `kerneltune.rms_norm` with `formula`."""
    offset = formula.offset
    default = "llama" if offset == 0.0 else "gemma"
    casting = None if formula.casting_mode == default else formula.casting_mode

    def __init__(self: nn.Module, *args: Any, **kwargs: Any) -> None:
        cls.__init__(self, *args, **kwargs)
        if not _plain(self, eps_attribute):  # e.g. built without its weight: its own forward
            self.forward = MethodType(cls.forward, self)

    def forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden_states, self.weight, getattr(self, eps_attribute), offset, casting)

    return type(cls.__name__, (cls,), {
        "__init__": __init__, "forward": forward,
        "__module__": cls.__module__, "__qualname__": cls.__qualname__,
        "__doc__": f"{cls.__name__} computed by kerneltune ({formula}).",
        "kerneltune_formula": formula, "kerneltune_original": cls,
    })


def is_patched_class(cls: type) -> bool:
    return "kerneltune_original" in vars(cls)


@dataclass
class TransformersPatch:
    """What `patch_transformers` replaced: (modeling module, attribute, original class) per
    replacement, norm classes in `replaced` and fused decoder layer classes in `fused_layers`,
    and the classes (or modules) left alone with the reason. `undo()` puts them back."""

    replaced: list[tuple[ModuleType, str, type]] = field(default_factory=list)
    left_alone: dict[str, str] = field(default_factory=dict)
    fused_layers: list[tuple[ModuleType, str, type]] = field(default_factory=list)

    @property
    def classes(self) -> dict[str, Formula]:
        """Qualified name of each class replaced -> its formula."""
        return {f"{cls.__module__}.{cls.__name__}": getattr(module, name).kerneltune_formula
                for module, name, cls in self.replaced}

    def undo(self) -> None:
        for module, name, original in reversed(self.replaced + self.fused_layers):
            setattr(module, name, original)
        self.replaced.clear()
        self.fused_layers.clear()

    def __enter__(self) -> TransformersPatch:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.undo()


def _rmsnorm_classes(module: ModuleType) -> Iterable[tuple[str, type[nn.Module]]]:
    for name, value in sorted(vars(module).items()):
        if (name.endswith("RMSNorm") and isinstance(value, type)
                and issubclass(value, nn.Module) and not is_patched_class(value)):
            yield name, value


def _decoder_layer_classes(module: ModuleType) -> Iterable[tuple[str, type[nn.Module]]]:
    for name, value in sorted(vars(module).items()):
        if (name.endswith("DecoderLayer") and isinstance(value, type)
                and issubclass(value, nn.Module) and not is_fused_class(value)):
            yield name, value


def _fuse_layer_classes(module: ModuleType, patch: TransformersPatch) -> None:
    for name, cls in _decoder_layer_classes(module):
        made = fused_class(cls)
        if isinstance(made, str):
            patch.left_alone[f"{cls.__module__}.{cls.__name__}"] = f"residuals not fused: {made}"
        else:
            patch.fused_layers.append((module, name, cls))
            setattr(module, name, made)


def patch_transformers(model_types: Sequence[str] | None = None, fuse_residuals: bool = False
                       ) -> TransformersPatch:
    """Make the installed transformers build kerneltune's RMSNorm: every model type's norm
    classes, or those of `model_types` (e.g. ``["llama", "qwen3"]``); with `fuse_residuals`,
    decoder layers that add each residual and norm the sum in one kernel too. Models built
    before keep their modules (`patch_model` and `fuse_residuals` swap those). Returns the
    handle that undoes it (`unpatch_transformers(handle)`, ``handle.undo()``, or a ``with``
    block)."""
    if isinstance(model_types, str):
        model_types = [model_types]
    modules, unimportable = modeling_modules(model_types)
    patch = TransformersPatch(left_alone=unimportable)
    made: dict[type, type | None] = {}
    for module in modules:
        for name, cls in _rmsnorm_classes(module):
            if cls not in made:
                probed = probe_class(cls)
                made[cls] = None if probed is None else kerneltune_class(cls, *probed)
                if probed is None:
                    patch.left_alone[f"{cls.__module__}.{cls.__name__}"] = (
                        "not a plain RMSNorm: its constructor is not (hidden_size, eps) or its "
                        "formula or rounding is another")
            if made[cls] is not None:
                patch.replaced.append((module, name, cls))
                setattr(module, name, made[cls])
        if fuse_residuals:
            _fuse_layer_classes(module, patch)
    return patch


def unpatch_transformers(patch: TransformersPatch) -> None:
    """Put back the classes `patch_transformers` replaced."""
    patch.undo()
