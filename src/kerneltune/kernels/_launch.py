"""A kernel call described as data: the tensors it returns and the Triton launches that fill them.

Each kernel module writes its launch once, as a ``describe_*`` function that allocates the
outputs and lists every launch (kernel, grid, runtime arguments, constexprs and launch options)
that a config makes. Everything that launches consumes that description: the module's own
launcher (`run`), the tuner and benchmarks through it, and the runtime's fast paths, which
compile each described launch once and then launch the compiled kernel directly
(`kerneltune.runtime.launch`, `kerneltune.runtime.replay`). No launch is written twice, so
nothing has to check that two copies agree.
"""

from __future__ import annotations

import inspect
from typing import Any, NamedTuple

import torch


class Launch(NamedTuple):
    """One Triton launch: ``kernel[grid](*args, **meta)``. `args` are the kernel's runtime
    arguments in order (its leading parameters); `meta` its constexprs and Triton's launch
    options (num_warps, num_stages, maxnreg, launch_pdl) by keyword."""

    kernel: Any
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    meta: dict[str, Any]

    def __call__(self) -> Any:
        """Launch through Triton; returns the compiled kernel (None under the interpreter)."""
        return self.kernel[self.grid](*self.args, **self.meta)

    def bound_values(self) -> list[Any]:
        """Every parameter's value in the kernel's order (defaults filled in), as Triton's
        ``JITFunction.run`` passes them to a compiled kernel; launch options are not among
        them."""
        names = self.kernel.arg_names
        bound = _signature(self.kernel).bind(
            *self.args, **{k: v for k, v in self.meta.items() if k in names})
        bound.apply_defaults()
        return list(bound.arguments.values())


class Described(NamedTuple):
    """A kernel call: the outputs it returns (allocated by the description), its launches, in
    order (none where there is nothing to compute, e.g. no rows), and its scratch: tensors the
    launches read after they are set up, which every call must therefore make anew (a row
    split's partial slots); a launch path may keep an output it drops across calls, never
    these."""

    outputs: tuple[torch.Tensor, ...]
    launches: tuple[Launch, ...]
    scratch: tuple[torch.Tensor, ...] = ()


def run(call: Described) -> tuple[torch.Tensor, ...]:
    """Make a described call's launches through Triton; its outputs."""
    for launch in call.launches:
        launch()
    return call.outputs


_signatures: dict[int, inspect.Signature] = {}


def _signature(kernel: Any) -> inspect.Signature:
    found = _signatures.get(id(kernel))
    if found is None:
        found = _signatures[id(kernel)] = inspect.signature(kernel.fn)
    return found
