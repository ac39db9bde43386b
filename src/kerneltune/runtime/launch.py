"""Low-overhead kernel launches for eager inference.

A Triton launch through ``kernel[grid](...)`` binds and specialises every argument in Python
on each call, which takes more host time than a small-M RMSNorm takes on the GPU. Each kernel
module describes its launch once (`kerneltune.kernels._launch`: the outputs it allocates, the
kernel, grid, arguments, constexprs and launch options); here a `Kernel` is that description
with the compiled kernels it has met. The first call per (kernel, config, argument
specialisation) launches the description through Triton and keeps the ``CompiledKernel``
Triton returns; later calls describe the call again (allocating its outputs) and launch the
compiled kernel directly: through torch's C++ launcher for Triton cubins where this torch has
one (`static_launcher`), else with ``CompiledKernel.run(grid, stream, function, metadata,
...)``, the very call ``JITFunction.run`` ends with. A config whose calls make scratch or
several launches (a row split) is known after one call; its later calls are recorded and
replayed (`kerneltune.runtime.replay`), not described again.

Fast launches made while a CUDA graph is captured are programmatic dependent launches where
the device has them (`kerneltune.kernels._dependent_launch`), as the modules' launchers make
theirs: replayed, each kernel is placed while the one before it finishes. Eager fast launches
are not: torch's C++ launcher has no such launch, Triton's costs microseconds more a call, and
at the sizes where the overlap would pay the host is slower than the GPU anyway.

Anything unexpected keeps a call on Triton's own launch: a Triton whose ``JITFunction.run``
launches differently, launch hooks (profilers), or the interpreter (no compiled kernels).

Calls go one step further (`bind`, `run_bound`): once a call has been launched this way, its whole
launch is bound to a key of its call site and everything that decided it (types, shapes,
strides, dtypes, devices, alignments, eps, offset, quant mode), so the next call with that key
reads the key, allocates its outputs and launches, with no description or specialisation key in
between (and the public functions, which look the key up first, with no checks either).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from kerneltune.kernels import KernelConfig
from kerneltune.kernels._launch import Described, Launch, run
from kerneltune.kernels._spec import dependent_launch
from kerneltune.kernels.add_rmsnorm import describe_add_rmsnorm_fwd
from kerneltune.kernels.rmsnorm_fwd import describe_rmsnorm_fwd
from kerneltune.kernels.rmsnorm_quant import describe_rmsnorm_quant_fwd
from kerneltune.runtime import _launchers, replay
from kerneltune.runtime._launchers import Launcher, static_launcher, triton_launcher
from kerneltune.runtime.sources import warn_once


@dataclass
class Kernel:
    """A kernel module's launch: `describe(*inputs, config, pdl=...)` (a ``describe_*`` of
    `kerneltune.kernels`), what besides the config and the arguments' specialisation decides
    its launch (`variant(*inputs)`, e.g. offset != 0), and the compiled kernels met so far."""

    name: str
    describe: Callable[..., Described]
    variant: Callable[..., Any]
    compiled: dict[tuple, Launcher] = field(default_factory=dict)
    enabled: bool = True
    #: Configs (by identity) whose calls are never bound: a row split's scratch or several
    #: launches. Known after one call; later calls are replayed (`replayed`).
    unbindable: set[int] = field(default_factory=set)
    #: The description a replay records where `describe` keeps state of its own across calls
    #: (a reused buffer, which a recording cannot tell from a stray tensor).
    replay_describe: Callable[..., Described] | None = None
    #: ``replayed(config, config_key, *inputs)``: the call through `kerneltune.runtime.replay`
    #: (made on first use).
    replayed: Callable[..., Any] | None = field(default=None, repr=False)


def _arg_key(args: tuple) -> tuple:
    """Everything Triton specialises a compiled kernel on: dtypes and 16-byte alignment of
    pointers; integers equal to 1, divisible by 16, or beyond 32 bits."""
    key = []
    for a in args:
        t = type(a)
        if t is int:
            key.append((a == 1) | ((a & 15) == 0) << 1 | (-0x80000000 <= a <= 0x7FFFFFFF) << 2)
        elif t is torch.Tensor or isinstance(a, torch.Tensor):
            key.append((a.dtype, (a.data_ptr() & 15) == 0))
        elif t is float:
            key.append(0)
        else:
            key.append(a)
    return tuple(key)


def launch(k: Kernel, config: KernelConfig, config_key: Any, *inputs: Any) -> Any:
    """Run kernel `k` on `inputs` with `config` (whose hashable identity is `config_key`)."""
    drv = _launchers.fast_driver()
    if drv is None or not k.enabled:
        return run(k.describe(*inputs, config))
    if id(config) in k.unbindable:
        return _replayed(k)(config, config_key, *inputs)
    pdl = _launchers.capturing() and dependent_launch(inputs[0].device)
    call = k.describe(*inputs, config, pdl=pdl)
    if _row_split(call):
        k.unbindable.add(id(config))  # replayed from its next call on
    if len(call.launches) != 1 or len(call.launches[0].grid) != 1:
        return run(call)  # no rows, or a row split's several launches
    (step,) = call.launches
    if _launchers.launch_hooked(drv.knobs.runtime.launch_enter_hook):  # a profiler's: Triton's
        return run(call)
    device = drv.get_device()
    key = (config_key, k.variant(*inputs), device, _arg_key(step.args), pdl)
    hit = k.compiled.get(key)
    if hit is None:
        _first_launch(k, key, step)
    else:
        hit(step.grid[0], drv.get_stream(device), _addresses(step.args))
    return call.outputs


def _row_split(call: Described) -> bool:
    """Whether a call's config splits each row over programs (scratch slots, or one launch per
    agreement): such a config is never bound, and its calls are replayed (`Kernel.unbindable`)."""
    return bool(call.scratch) or len(call.launches) > 1


def _replayed(k: Kernel) -> Callable[..., Any]:
    """`k.replayed`: k's calls recorded and replayed, each launch a dependent one while a graph
    is captured, as `launch` makes them."""
    if k.replayed is None:
        describe = k.replay_describe or k.describe

        def described(*args: Any) -> Described:
            *inputs, config = args
            return describe(*inputs, config,
                            pdl=_launchers.capturing() and dependent_launch(inputs[0].device))

        k.replayed = functools.partial(replay.run, replay.register(
            replay.Replayed(k.name, described)))
    return k.replayed


def _addresses(args: tuple) -> tuple:
    """The arguments as the compiled kernel takes them, tensors as their addresses: given an
    object with `data_ptr`, both launchers ask the driver to translate it (cuPointerGetAttribute,
    microseconds per pointer, a lock each), given an int they use it."""
    tensor = torch.Tensor
    return tuple(a.data_ptr() if isinstance(a, tensor) else a for a in args)


def _first_launch(k: Kernel, key: tuple, step: Launch) -> None:
    """Launch `step` through Triton, keeping the compiled kernel it returns for `key`."""
    kernel = step()
    if kernel is None or not hasattr(kernel, "packed_metadata"):
        # Nothing to launch directly: this kernel keeps to Triton's launch from now on.
        k.enabled = False
        warn_once(f"plan:{k.name}", f"kerneltune: fast launch of {k.name} disabled: this "
                  "Triton's compiled kernel has no packed metadata")
        return
    tail = tuple(step.bound_values()[len(step.args):])
    k.compiled[key] = static_launcher(kernel) or triton_launcher(kernel, tail)


_kernels: list[Kernel] = []


def register(k: Kernel) -> Kernel:
    _kernels.append(k)
    return k


def reset() -> None:
    _launchers.reset()
    _rstd_scratch.clear()
    _bound.clear()
    for k in _kernels:
        k.compiled.clear()
        k.unbindable.clear()
        k.enabled = True


# --------------------------------------------------------------------------- the kernels

#: Per (device, rows): an fp32 vector the inference forward writes its rstd to. Nobody reads it
#: (writes from concurrent launches race harmlessly); it saves an allocation a call.
_rstd_scratch: dict[tuple[torch.device, int], torch.Tensor] = {}
_SCRATCH_ENTRIES = 64


def _scratch_rstd(device: torch.device, m: int) -> torch.Tensor:
    buf = _rstd_scratch.get((device, m))
    if buf is None:
        if len(_rstd_scratch) >= _SCRATCH_ENTRIES:
            _rstd_scratch.clear()
        buf = _rstd_scratch[(device, m)] = torch.empty((m,), dtype=torch.float32, device=device)
    return buf


def _describe_inference_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float,
                            config: KernelConfig, pdl: bool | None = None) -> Described:
    """The forward with its rstd written to a reused scratch vector (only y is wanted)."""
    return describe_rmsnorm_fwd(x, weight, eps, offset, config, pdl,
                                rstd=_scratch_rstd(x.device, x.shape[0]))


def _offset_variant(*inputs: Any) -> bool:
    return inputs[-1] != 0.0  # offset, the last input


RMSNORM_FWD = register(Kernel("rmsnorm_fwd", describe_rmsnorm_fwd, _offset_variant))
RMSNORM_FWD_INFERENCE = register(Kernel("rmsnorm_fwd_inference", _describe_inference_fwd,
                                        _offset_variant, replay_describe=describe_rmsnorm_fwd))
ADD_RMSNORM_FWD = register(Kernel("add_rmsnorm_fwd", describe_add_rmsnorm_fwd, _offset_variant))
RMSNORM_QUANT_FWD = register(Kernel(
    "rmsnorm_quant_fwd", describe_rmsnorm_quant_fwd,
    lambda x, weight, bias, eps, quant: (quant, weight is None, bias is None)))


# ----------------------------------------------------------------------------- bound calls


class _Binding(NamedTuple):
    """A call's launch, bound (see `bind`)."""

    allocate: Callable[[torch.Tensor], tuple[torch.Tensor, ...]]  # new outputs, from x
    take: Callable[[tuple], Any]  # the call's tensors among its arguments
    pick: Callable[[tuple], tuple]  # the kernel's arguments from (tensors, outputs, constants)
    kernel: Launcher
    grid: int
    device: int
    constants: tuple  # scalars, and the addresses of the buffers of dropped outputs
    kept: tuple  # those buffers, kept alive


#: Bound calls by `call_key`. Cleared past the limit (a new key costs one call through `launch`
#: again).
_bound: dict[tuple, _Binding] = {}
_BOUND_ENTRIES = 4096


def call_key(site: str, args: tuple) -> tuple:
    """Everything about a call from `site` with `args` that its validation, config and
    compiled kernel depend on: each tensor's type, shape, strides, dtype, device and 16-byte
    alignment; each other argument's type and value (a bool eps equals 1.0 but is no valid
    eps). Unhashable where an argument is."""
    key: list[Any] = [site]
    tensor = torch.Tensor
    for a in args:
        if isinstance(a, tensor):
            key += (type(a), a.shape, a.stride(), a.dtype, a.get_device(), a.data_ptr() & 15)
        else:
            key += (type(a), a)
    return tuple(key)


_data_ptr = torch.Tensor.data_ptr


def run_bound(site: str, *args: Any) -> tuple[torch.Tensor, ...] | None:
    """Launch a call from `site` with `args` as its key was bound, returning the outputs it
    keeps; None, launching nothing, where it was not (first call of its key, no fast path) or
    must not be now (a launch hook installed, another current device, a graph capture)."""
    if not _bound:
        return None
    try:
        binding = _bound.get(call_key(site, args))
    except TypeError:  # unhashable: the full checks say what is wrong
        return None
    if binding is None:
        return None
    x, drv = args[0], _launchers._driver
    if (drv.get_device() != x.get_device() or _launchers.capturing()
            or _launchers.launch_hooked(drv.knobs.runtime.launch_enter_hook)):
        return None
    allocate, take, pick, hit, grid, device, constants, _ = binding
    new = allocate(x)
    hit(grid, drv.get_stream(device), pick((*map(_data_ptr, take(args)), *map(_data_ptr, new),
                                            *constants)))
    return new


def bind(site: str, k: Kernel, config: KernelConfig, args: tuple, inputs: tuple,
         outputs: tuple[torch.Tensor | None, ...]) -> None:
    """Bind a call from `site` to its launch (see `run_bound`).

    The call, with arguments `args` (x first), went through ``launch(k, config, id(config),
    *inputs)``, `inputs` being the kernel's views of args' tensors position for position and
    its scalars, and returned `outputs`: the described outputs as the call returns them, None
    for one it drops (written, from now on, to a buffer kept here). Each site drops the same
    ones.
    """
    drv, x = _launchers._driver, args[0]
    if (drv is None or not k.enabled or id(config) in k.unbindable or _launchers.capturing()
            or drv.get_device() != x.get_device()):
        return
    tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    if (any(inputs[i].data_ptr() != args[i].data_ptr() for i in tensors)
            or len({id(inputs[i]) for i in tensors}) < len(tensors)):
        return  # copied on each call, or one tensor in two places (told apart by identity)
    returned = [j for j, t in enumerate(outputs) if t is not None]
    if not all(outputs[j].is_contiguous() for j in returned):
        return
    call = k.describe(*inputs, config, pdl=False)
    if _row_split(call):
        k.unbindable.add(id(config))  # its slots are made anew by each call
    if len(call.launches) != 1 or len(call.launches[0].grid) != 1:
        return  # a split, or no rows: an empty call says nothing of its config's other calls
    (step,) = call.launches
    device = x.get_device()
    hit = k.compiled.get((id(config), k.variant(*inputs), device, _arg_key(step.args), False))
    if hit is None:
        return
    # Each runtime argument by where it comes from: the call's tensors, its new outputs, or a
    # constant (scalars, and the buffers of dropped outputs).
    slot = {id(inputs[t]): i for i, t in enumerate(tensors)}
    slot.update({id(call.outputs[j]): len(tensors) + i for i, j in enumerate(returned)})
    constants: list[Any] = []
    picks = []
    for a in step.args:
        i = slot.get(id(a))
        if i is None:
            i = len(tensors) + len(returned) + len(constants)
            constants.append(a)
        picks.append(i)
    kept = tuple(constants)
    pick = tuple if picks == list(range(len(picks))) else operator.itemgetter(*picks)
    allocate = _allocate([_allocator(outputs[j], x) for j in returned])
    if len(_bound) >= _BOUND_ENTRIES:
        _bound.clear()
    _bound[call_key(site, args)] = _Binding(allocate, _taker(tensors), pick, hit,
                                            step.grid[0], device, _addresses(kept), kept)


def _taker(tensors: list[int]) -> Callable[[tuple], Any]:
    """The tensors among a call's arguments (at positions `tensors`), as a sequence."""
    if len(tensors) == 1:  # x alone (itemgetter returns a tuple only for two or more items)
        return operator.itemgetter(slice(0, 1))
    return operator.itemgetter(*tensors)


def _allocate(allocators: list[Callable[[torch.Tensor], torch.Tensor]]
              ) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
    """All of a bound call's new outputs from its x, with one Python call where there are one
    or two (each call's host time counts)."""
    if len(allocators) == 1:
        (first,) = allocators
        return lambda x: (first(x),)
    if len(allocators) == 2:
        first, second = allocators
        return lambda x: (first(x), second(x))
    return lambda x: tuple([allocate(x) for allocate in allocators])


def _allocator(t: torch.Tensor, x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """How a bound call makes a new contiguous output shaped like `t` from the call's x:
    `empty_like(x)` where it has x's shape, about half the host time of
    ``torch.empty(shape, dtype=, device=)``; `new_empty` for other shapes, also cheaper; x's
    strides are part of the call's key."""
    if t.shape != x.shape:
        shape, dtype = t.shape, t.dtype
        return lambda x: x.new_empty(shape, dtype=dtype)
    options: dict[str, Any] = {} if t.dtype == x.dtype else {"dtype": t.dtype}
    if not x.is_contiguous():
        options["memory_format"] = torch.contiguous_format
    return functools.partial(torch.empty_like, **options) if options else torch.empty_like
