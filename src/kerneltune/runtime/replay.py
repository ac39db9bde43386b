"""Replayed launches: a kernel call of several launches, described once per call key and
launched through Triton, then repeated for later calls of that key with their own tensors,
without the description's Python or Triton's binding of every argument.

For calls `kerneltune.runtime.launch` cannot bind (one launch, described once): the backward
launches its main kernel and the reduction of the per-program dw partials, a split the fill of
its slots before them; a forward's row split fills its slots with torch, then launches one
kernel or one per agreement (`launch` hands such a config's calls here). Through Triton (a
``kernel[grid](...)`` each), or described anew for each call, their host time exceeds their
GPU time below some thousands of rows; replayed, it takes a fraction of that.

A recording stands for every call of its key: the config, each input's type, shape, strides,
dtype, device and 16-byte alignment, the scalars, the current device and whether a CUDA graph
is being captured. A description decides its grids, kernels and arguments from nothing else.
What it allocates is allocated again on each replay (the same shape, strides and dtype:
uninitialised, or filled with the same constant where the description allocated it with
``torch.full``), since an allocation is all the torch work a replay may repeat: the recording
watches every torch operation the description makes (`TorchDispatchMode`), and one that is
neither an allocation nor a view (a fill of a tensor it has, a copy) makes the key's calls go
through Triton, as do inputs that share memory, launch hooks (profilers) and the interpreter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kerneltune.kernels import KernelConfig
from kerneltune.kernels._launch import Described
from kerneltune.kernels._launch import run as run_described
from kerneltune.kernels.rmsnorm_bwd import describe_rmsnorm_bwd
from kerneltune.runtime import _launchers

_ALLOCATIONS = frozenset({torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default,
                          torch.ops.aten.empty_like.default})
#: An allocation filled with a constant (its second argument), e.g. a split's partial slots.
_FILLED = torch.ops.aten.full.default


class _Watch(TorchDispatchMode):
    """The tensors a launcher allocates, with the constant each was filled with (None:
    uninitialised), and the torch operations it makes besides."""

    def __init__(self) -> None:
        super().__init__()
        self.allocated: list[torch.Tensor] = []
        self.fills: list[Any] = []
        self.other: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in _ALLOCATIONS or func is _FILLED:
            self.allocated.append(out)
            self.fills.append(args[1] if func is _FILLED else None)
        elif not func.is_view:
            self.other.append(str(func))
        return out


#: Where an argument comes from on replay.
INPUT, BUFFER, VALUE = 0, 1, 2


class Step(NamedTuple):
    """One recorded launch: the compiled kernel's launcher, the grid's x, and per argument
    (INPUT, input index, byte offset), (BUFFER, allocation index, byte offset) or (VALUE, the
    value, 0)."""

    launch: _launchers.Launcher
    grid: int
    sources: tuple[tuple[int, Any, int], ...]


class Recording(NamedTuple):
    """A launcher's call: what it allocated (shape, strides, dtype, device, and the constant
    it was filled with or None), its launches in order, and which allocations it returned."""

    buffers: tuple[tuple[tuple[int, ...], tuple[int, ...], torch.dtype, torch.device, Any], ...]
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]


@dataclass
class Replayed:
    """A kernel module's launch description, `describe(*inputs, config)`."""

    name: str
    describe: Callable[..., Described]
    recordings: dict[tuple, Recording | None] = field(default_factory=dict)


_all: list[Replayed] = []
#: Recordings kept per launcher (one per call key: variable sequence lengths make many).
_ENTRIES = 4096


def register(r: Replayed) -> Replayed:
    _all.append(r)
    return r


def reset() -> None:
    for r in _all:
        r.recordings.clear()


def _describe(a: Any) -> tuple:
    if isinstance(a, torch.Tensor):
        return (type(a), a.dtype, a.shape, a.stride(), a.device, a.data_ptr() & 15)
    return (type(a), a)


def run(r: Replayed, config: KernelConfig, config_key: Any, *inputs: Any) -> Any:
    """`r.describe(*inputs, config)` launched, replayed where a call of this key was
    recorded; its outputs."""
    drv = _launchers.fast_driver()
    if drv is None or _launchers.launch_hooked(drv.knobs.runtime.launch_enter_hook):
        return run_described(r.describe(*inputs, config))
    device = drv.get_device()
    key = (config_key, device, _launchers.capturing(), *map(_describe, inputs))
    if key not in r.recordings:
        return _record(r, config, key, inputs)
    recording = r.recordings[key]
    if recording is None:
        return run_described(r.describe(*inputs, config))
    return _replay(recording, inputs, drv.get_stream(device))


def _replay(rec: Recording, inputs: tuple, stream: int) -> tuple:
    buffers = [torch.empty_strided(shape, strides, dtype=dtype, device=device) if fill is None
               else torch.full(shape, fill, dtype=dtype, device=device)
               for shape, strides, dtype, device, fill in rec.buffers]
    bases = ([a.data_ptr() if isinstance(a, torch.Tensor) else None for a in inputs],
             [b.data_ptr() for b in buffers])
    for step in rec.steps:
        step.launch(step.grid, stream, tuple(
            value if kind == VALUE else bases[kind][value] + offset
            for kind, value, offset in step.sources))
    return tuple(buffers[i] for i in rec.outputs)


def _source(value: Any, groups: tuple[list[torch.Tensor], list[torch.Tensor]]
            ) -> tuple[int, Any, int] | None:
    """Where a launch argument comes from: an input's or an allocation's memory (the tensor
    itself or a view of it), else a value; None for a tensor of neither."""
    if not isinstance(value, torch.Tensor):
        return VALUE, value, 0
    storage = value.untyped_storage().data_ptr()
    for kind in (INPUT, BUFFER):
        for i, t in enumerate(groups[kind]):
            if t is not None and t.untyped_storage().data_ptr() == storage:
                return kind, i, value.data_ptr() - t.data_ptr()
    return None


def _recording(call: Described, kernels: list[Any], watch: _Watch, inputs: tuple
               ) -> Recording | str:
    """The recording of a described call whose launches compiled to `kernels`, or why it
    cannot be replayed."""
    if watch.other:
        return f"it calls {', '.join(sorted(set(watch.other)))}"
    allocated = watch.allocated
    # (Tensors are matched by memory: the mode sees other Python objects than the caller.)
    returned = [next((j for j, b in enumerate(allocated) if _layout(b) == _layout(t)), None)
                for t in call.outputs]
    if None in returned:
        return "it returns a tensor it did not allocate"
    tensors = [a if isinstance(a, torch.Tensor) else None for a in inputs]
    steps = []
    for step, kernel in zip(call.launches, kernels, strict=True):
        if kernel is None or not hasattr(kernel, "packed_metadata"):
            return "a launch without a compiled kernel"
        grid_yz = (*step.grid[1:], 1, 1)[:2]
        sources = [_source(v, (tensors, allocated)) for v in step.bound_values()]
        if None in sources:
            return "a launch takes a tensor that is neither an input nor allocated by it"
        steps.append(Step(_launchers.static_launcher(kernel, grid_yz)
                          or _launchers.triton_launcher(kernel, (), grid_yz),
                          int(step.grid[0]), tuple(sources)))
    buffers = tuple((tuple(b.shape), b.stride(), b.dtype, b.device, fill)
                    for b, fill in zip(allocated, watch.fills, strict=True))
    return Recording(buffers, tuple(steps), tuple(returned))


def _layout(t: torch.Tensor) -> tuple:
    return t.data_ptr(), t.shape, t.stride(), t.dtype, t.device


def _shares_memory(inputs: tuple) -> bool:
    storages = [a.untyped_storage().data_ptr() for a in inputs if isinstance(a, torch.Tensor)]
    return len(set(storages)) != len(storages)


def _record(r: Replayed, config: KernelConfig, key: tuple, inputs: tuple) -> Any:
    if _shares_memory(inputs):  # a replay would tell them apart: this call is not recorded
        return run_described(r.describe(*inputs, config))
    with _Watch() as watch:
        call = r.describe(*inputs, config)
    kernels = [step() for step in call.launches]
    recording = _recording(call, kernels, watch, inputs)
    if len(r.recordings) >= _ENTRIES:  # a new key costs one call through Triton again
        r.recordings.clear()
    # Not replayable (an empty batch's zero dw, say): its key's calls take Triton's launch.
    r.recordings[key] = None if isinstance(recording, str) else recording
    return call.outputs


RMSNORM_BWD = register(Replayed("rmsnorm_bwd", describe_rmsnorm_bwd))
