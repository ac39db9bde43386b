"""`fuse_residuals`: the residual add and the RMSNorm after it, one `add_rms_norm` kernel, in the
decoder layers of Hugging Face models.

A pre-norm decoder layer (Llama, Mistral, Qwen2, Qwen3, Gemma, ...) ends its attention block
with::

    hidden_states = residual + hidden_states
    residual = hidden_states
    hidden_states = self.post_attention_layernorm(hidden_states)

which reads the sum back right after writing it. `add_rms_norm(x, residual, w)` returns the
same two tensors, ``(rms_norm(x + residual), x + residual)``, from one pass.

How a layer is fused: its class's forward, as the installed transformers defines it, is parsed
(`inspect.getsource`), every run of exactly those three statements (an add of two names, the sum
kept as the residual, a norm attribute of the layer called on the sum alone) becomes one call
``hidden_states, residual = add_norm(self, "post_attention_layernorm", hidden_states,
residual)``, and the rest is compiled unchanged, with its own decorators, in its own module's
globals, under its own file name and line numbers. The result is the forward of a subclass
that keeps the class's name (`GradientCheckpointingLayer` wraps it as it wraps the original),
so the signature, the cache arguments and the return value are the installed version's
whatever they are. Nothing else is matched: Gemma2's and Gemma3's attention output is normed
before its add (norm, then add: left as is), and only their add followed by
``pre_feedforward_layernorm`` is fused; OLMo2 norms after its adds and has nothing to fuse.
Fusion across layers (the MLP's add with the next layer's input norm) would change what a
layer returns, and is not done.

Each norm keeps its formula: a kerneltune `RMSNorm` its own, a class `patch_transformers` made
its class's, a Hugging Face module the probed one (`hf_formula`: Gemma's offset 1, OLMo2's
rounding); the sum ``x + residual`` is rounded to the dtype once, as torch's add rounds it, so a
fused layer computes what the unfused one does with kerneltune's norm. A call the kernel cannot
take as the layer would (a norm with hooks or its own forward, such as accelerate's device
hooks; dtypes, shapes or devices that differ; a norm whose formula is unknown) runs the
original add and norm.

`fuse_residuals(model)` swaps the class of each fusable layer for its fused subclass and
returns the handle that undoes it; `patch_transformers(fuse_residuals=True)` puts the fused
classes in transformers' modeling modules, for models built afterwards.
"""

from __future__ import annotations
import __future__

import ast
import inspect
import sys
import textwrap
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn.modules import module as nn_module

from kerneltune.runtime.modules import RMSNorm, _eps_of, _looks_like_rmsnorm, hf_formula
from kerneltune.runtime.ops import add_rms_norm
from kerneltune.runtime.sources import KerneltuneWarning

#: Where a layer keeps, per fused norm, the norm module and the arguments of its kernel.
_STATE = "_kerneltune_add_norms"
#: The name the rewritten forward calls `add_norm` by (a closure variable, not a global).
_HELPER = "_kerneltune_add_norm"
#: The compiler flags of `from __future__` imports, which a forward compiled again keeps.
_FUTURE_FLAGS = 0
for _name in __future__.all_feature_names:
    _FUTURE_FLAGS |= getattr(__future__, _name).compiler_flag


class _Norm(NamedTuple):
    """A norm module and its kernel arguments; offset None where its formula is unknown."""

    module: nn.Module
    eps: float
    offset: float | None
    casting_mode: str | None


def _norm_arguments(norm: nn.Module) -> _Norm:
    """`norm` with the eps, offset and casting mode (None for the default) its kernel takes."""
    if isinstance(norm, RMSNorm):
        eps, formula = norm.variance_epsilon, (norm.offset, norm.casting_mode)
    else:
        eps = _eps_of(norm)
        formula = getattr(type(norm), "kerneltune_formula", None)  # a patch_transformers class
        if formula is None and eps is not None and _looks_like_rmsnorm(norm):
            formula = hf_formula(norm)
    if formula is None or eps is None:
        return _Norm(norm, 0.0, None, None)
    offset, mode = formula
    return _Norm(norm, eps, offset, None if mode == ("llama" if offset == 0.0 else "gemma")
                 else mode)


def _remember(layer: nn.Module, name: str, norm: nn.Module) -> _Norm:
    found = _norm_arguments(norm)
    layer.__dict__.setdefault(_STATE, {})[name] = found
    return found


def _hooked(norm: nn.Module) -> bool:
    """Whether calling `norm` runs more than its class's forward (the test `nn.Module.__call__`
    makes before its fast path, and a forward of the instance's own)."""
    return bool(
        "forward" in norm.__dict__
        or norm._forward_hooks or norm._forward_pre_hooks
        or norm._backward_hooks or norm._backward_pre_hooks
        or nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks
        or nn_module._global_backward_hooks or nn_module._global_backward_pre_hooks
    )


def add_norm(layer: nn.Module, name: str, x: torch.Tensor, residual: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(layer.<name>(residual + x), residual + x)``, by `add_rms_norm` where it computes that.

    What a fused forward calls in place of the add and the norm."""
    norm = getattr(layer, name)
    state = layer.__dict__.get(_STATE)
    found = None if state is None else state.get(name)
    if found is None or found.module is not norm:  # a layer built fused, or a norm swapped
        found = _remember(layer, name, norm)
    weight = getattr(norm, "weight", None)
    if (found.offset is None or _hooked(norm) or not isinstance(weight, torch.Tensor)
            or not x.dtype == residual.dtype == weight.dtype
            or x.shape != residual.shape or not x.device == residual.device == weight.device):
        s = residual + x  # the layer's own add and norm
        return norm(s), s
    return add_rms_norm(x, residual, weight, found.eps, found.offset, found.casting_mode)


# ----------------------------------------------------------------------- the rewrite


def _name(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else None


def _single_assign(stmt: ast.stmt) -> tuple[str, ast.expr] | None:
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target = _name(stmt.targets[0])
        if target is not None:
            return target, stmt.value
    return None


def _match(stmts: list[ast.stmt], self_name: str) -> tuple[str, str, str] | None:
    """(hidden, residual, norm attribute) where `stmts` are ``h = r + h`` (or ``h + r``),
    ``r = h``, ``h = self.<...norm...>(h)``; else None (OLMo2's ``h = self.mlp(h)`` after its
    add among them)."""
    if len(stmts) < 3:
        return None
    add, keep, norm = (_single_assign(s) for s in stmts[:3])
    if add is None or keep is None or norm is None:
        return None
    h, value = add
    if not (isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add)):
        return None
    operands = [_name(value.left), _name(value.right)]
    if h not in operands or None in operands or operands[0] == operands[1]:
        return None
    r = operands[1] if operands[0] == h else operands[0]
    if keep[0] != r or _name(keep[1]) != h or norm[0] != h:
        return None
    call = norm[1]
    if not (isinstance(call, ast.Call) and not call.keywords and len(call.args) == 1
            and _name(call.args[0]) == h and isinstance(call.func, ast.Attribute)
            and _name(call.func.value) == self_name and "norm" in call.func.attr.lower()):
        return None
    return h, r, call.func.attr


def _rewrite(fn: ast.FunctionDef) -> list[str]:
    """Replace each add-then-norm run of `fn`'s body by one `add_norm` call; the norms' names."""
    params = [*fn.args.posonlyargs, *fn.args.args]
    if not params:
        return []
    self_name, body, norms, i = params[0].arg, fn.body, [], 0
    new_body: list[ast.stmt] = []
    while i < len(body):
        found = _match(body[i:i + 3], self_name)
        if found is None:
            new_body.append(body[i])
            i += 1
            continue
        h, r, norm = found
        call = ast.parse(f"{h}, {r} = {_HELPER}({self_name}, {norm!r}, {h}, {r})").body[0]
        for node in ast.walk(call):  # tracebacks point at the three lines it replaces
            if "lineno" in node._attributes:
                node.lineno, node.end_lineno = body[i].lineno, body[i + 2].end_lineno
                node.col_offset, node.end_col_offset = body[i].col_offset, 0
        new_body.append(call)
        norms.append(norm)
        i += 3
    fn.body = new_body
    return norms


def _wrappers(function: Callable) -> list[Any]:
    """The code of each wrapper from `function` down to what it wraps last (decorators, and the
    `GradientCheckpointingLayer` wrapper); None for a wrapper that is no Python function."""
    chain = []
    while hasattr(function, "__wrapped__"):
        chain.append(getattr(function, "__code__", None))
        function = function.__wrapped__
    return chain


def _fused_forward(cls: type[nn.Module]) -> tuple[Callable, list[str]] | str:
    """`cls.forward` with its add-then-norm runs fused, and the norms' names; or why not."""
    raw = inspect.unwrap(cls.forward)
    code = getattr(raw, "__code__", None)
    module = sys.modules.get(getattr(raw, "__module__", None) or "")
    if code is None or module is None:
        return "its forward is not a Python function of an imported module"
    if code.co_freevars:  # super(), or a closure: not compiled again outside its scope
        return "its forward uses super() or a closure"
    try:
        source = textwrap.dedent(inspect.getsource(raw))
        filename = inspect.getsourcefile(raw) or code.co_filename
    except (OSError, TypeError):
        return "the source of its forward is not available"
    tree = ast.parse(source)
    fn = tree.body[0] if len(tree.body) == 1 else None
    if not isinstance(fn, ast.FunctionDef) or fn.name != raw.__name__:
        return "the source of its forward is not one function definition"
    norms = _rewrite(fn)
    if not norms:
        return "its forward has no residual add followed by a norm of the sum"
    # def _make(<helper>): <forward, decorators and all>; return forward
    make = ast.parse(f"def _make({_HELPER}):\n    return {fn.name}\n")
    make.body[0].body.insert(0, fn)
    ast.increment_lineno(make, code.co_firstlineno - 1)
    ast.fix_missing_locations(make)
    namespace: dict[str, Any] = {}
    exec(compile(make, filename, "exec", flags=code.co_flags & _FUTURE_FLAGS, dont_inherit=True),
         vars(module), namespace)
    return namespace["_make"](add_norm), norms


#: Each class's fused subclass, or why it has none.
_FUSED: dict[type, type | str] = {}


def is_fused_class(cls: type) -> bool:
    return "kerneltune_fused_norms" in vars(cls)


def fused_class(cls: type[nn.Module]) -> type[nn.Module] | str:
    """The subclass of a decoder layer class whose forward fuses its residual adds with the
    norms after them (same name, constructor, parameters and state dict); or why there is none.
    Made once per class."""
    if is_fused_class(cls):
        return "fused already"
    if cls not in _FUSED:
        _FUSED[cls] = _make_fused_class(cls)
    return _FUSED[cls]


def _make_fused_class(cls: type[nn.Module]) -> type[nn.Module] | str:
    try:
        made = _fused_forward(cls)
    except (SyntaxError, ValueError) as e:  # source that does not parse or compile here
        return f"its forward cannot be rewritten: {e}"
    if isinstance(made, str):
        return made
    forward, norms = made
    fused = type(cls.__name__, (cls,), {
        "forward": forward, "__module__": cls.__module__, "__qualname__": cls.__qualname__,
        "__doc__": f"{cls.__name__} with its residual adds fused into {', '.join(norms)}.",
        "kerneltune_original": cls, "kerneltune_fused_norms": tuple(norms),
    })
    # The same wrappers around it as around the original (its own decorators, and what the
    # class machinery adds): anything else wrapped the original after its class was made.
    if _wrappers(fused.forward) != _wrappers(cls.forward):
        return "its forward is wrapped by more than its own decorators"
    return fused


# ------------------------------------------------------------------------- the handle


@dataclass
class FusedResiduals:
    """What `fuse_residuals` did: per fused layer (qualified name) the norms now computed with
    the add before them, and the decoder layers left alone with the reason. `undo()` (or
    `unfuse_residuals`, or leaving a ``with`` block) puts the original forwards back."""

    fused: dict[str, tuple[str, ...]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    _layers: list[tuple[nn.Module, type]] = field(default_factory=list, repr=False)

    def undo(self) -> None:
        for layer, original in reversed(self._layers):
            if is_fused_class(type(layer)):
                layer.__class__ = original
            layer.__dict__.pop(_STATE, None)
        self._layers.clear()
        self.fused.clear()

    def __enter__(self) -> FusedResiduals:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.undo()


def _is_decoder_layer(module: nn.Module) -> bool:
    return type(module).__name__.endswith("DecoderLayer")


def fuse_residuals(model: nn.Module) -> FusedResiduals:
    """Fuse each residual add with the RMSNorm after it in the decoder layers of `model` (a
    Hugging Face model of the Llama family: Llama, Mistral, Qwen2, Qwen3, Gemma; Gemma2 and
    Gemma3 for their feed-forward norm), in place, with the norms' own formulas. Works with
    the Hugging Face norms or kerneltune's (`patch_model` before or after). Decoder layers
    (modules whose class name ends in "DecoderLayer") with nothing to fuse are left alone and
    listed in the handle's `skipped` (with one warning; one too where there are none).
    Returns the handle that undoes it."""
    handle = FusedResiduals()
    found = False
    for name, layer in model.named_modules():
        if not _is_decoder_layer(layer):
            continue
        found = True
        made = fused_class(type(layer))
        if isinstance(made, str):
            handle.skipped[name] = made
            continue
        norms = made.kerneltune_fused_norms
        unknown = [n for n in norms if _remember(layer, n, getattr(layer, n)).offset is None]
        if unknown:
            layer.__dict__.pop(_STATE, None)
            handle.skipped[name] = f"{', '.join(unknown)}: not an RMSNorm kerneltune computes"
            continue
        handle._layers.append((layer, type(layer)))
        layer.__class__ = made
        handle.fused[name] = norms
    unfused = {n: why for n, why in handle.skipped.items() if why != "fused already"}
    if not found:
        warnings.warn(f"kerneltune: no decoder layers in {type(model).__name__} (modules whose "
                      "class name ends in 'DecoderLayer'): residuals not fused",
                      KerneltuneWarning, stacklevel=2)
    elif unfused:
        warnings.warn(f"kerneltune: residuals not fused in {len(unfused)} decoder layers, e.g. "
                      f"{next(iter(unfused))}: {next(iter(unfused.values()))}",
                      KerneltuneWarning, stacklevel=2)
    return handle


def unfuse_residuals(handle: FusedResiduals) -> None:
    """Put back the forwards `fuse_residuals` replaced (``handle.undo()``)."""
    handle.undo()
