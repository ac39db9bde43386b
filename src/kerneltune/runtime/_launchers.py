"""What both fast launch paths (`kerneltune.runtime.launch`, one launch bound to a call key;
`kerneltune.runtime.replay`, a call of several launches recorded and repeated) stand on:
Triton's driver entry points, checked once (`fast_driver`: none under the interpreter, with
KERNELTUNE_FAST_LAUNCH=0, or on a Triton whose ``JITFunction.run`` launches differently),
whether a CUDA graph is being captured or a launch hook installed, and a compiled kernel's
launch (`static_launcher`: torch's C++ launcher for Triton cubins; `triton_launcher`: the call
``JITFunction.run`` ends with).
"""

from __future__ import annotations

import inspect
import operator
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kerneltune.kernels._spec import interpreting
from kerneltune.runtime.sources import warn_once

#: Set to 0 to always launch through Triton's own launch.
ENV_FAST_LAUNCH = "KERNELTUNE_FAST_LAUNCH"

#: The launch ``JITFunction.run`` performs, which the fast path repeats (Triton 3.4 to 3.9).
_EXPECTED_LAUNCH = (
    "kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata, "
    "launch_metadata, knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, "
    "*bound_args.values())"
)


@dataclass
class Driver:
    """Triton's driver entry points: the current device, its current stream, Triton's knobs
    (where a profiler installs its launch hooks)."""

    get_device: Callable[[], int]
    get_stream: Callable[[int], int]
    knobs: Any


#: The driver once checked (`fast_driver`), None where the fast paths must not be used.
_driver: Driver | None = None
_driver_checked = False

#: The current CUDA device, where Triton launches: torch's C getter, without the Python of
#: `torch.cuda.current_device` (which stands in on a torch without CUDA, never called there).
current_device: Callable[[], int] = getattr(torch._C, "_cuda_getDevice",
                                            torch.cuda.current_device)


def _check_driver() -> Driver | None:
    """The Triton driver entry points the fast path uses, or None where it must not be used."""
    global _driver, _driver_checked
    if _driver_checked:
        return _driver
    _driver_checked = True
    if interpreting() or os.environ.get(ENV_FAST_LAUNCH, "1") in ("0", "false", "off"):
        return None
    try:
        from triton import knobs
        from triton.runtime import driver
        from triton.runtime.jit import JITFunction

        source = " ".join(inspect.getsource(JITFunction.run).split())
        if " ".join(_EXPECTED_LAUNCH.split()) not in source:
            warn_once("fast-launch", "kerneltune: this Triton launches kernels differently; "
                      "using the standard launch path")
            return None
        _driver = Driver(current_device, driver.active.get_current_stream, knobs)
    except Exception as e:  # any Triton without these entry points
        warn_once("fast-launch", f"kerneltune: fast launch unavailable ({e}); using the "
                  "standard launch path")
        _driver = None
    return _driver


def fast_driver() -> Driver | None:
    """`_check_driver`, looked up once."""
    return _driver if _driver_checked else _check_driver()


def launch_hooked(hook: Any) -> bool:
    """Whether a launch hook is installed. Triton >= 3.4 keeps an always-present `HookChain`
    (empty unless a profiler adds to it); older ones keep None or the hook itself."""
    return hook is not None and bool(getattr(hook, "calls", True))


def reset() -> None:
    """Forget the driver (checked again on the next fast launch)."""
    global _driver, _driver_checked
    _driver, _driver_checked = None, False


#: Whether a CUDA graph is being captured on the current stream: the C function that
#: `torch.cuda.is_current_stream_capturing` calls, without its Python frame (bound calls ask it
#: every time).
capturing: Callable[[], bool] = getattr(torch._C, "_cuda_isCurrentStreamCapturing",
                                        torch.cuda.is_current_stream_capturing)


#: A compiled kernel's launch: (programs along the grid's x, stream, runtime arguments with
#: tensors as addresses); the grid's y and z are bound with the kernel.
Launcher = Callable[[int, int, tuple], None]


def triton_launcher(kernel: Any, tail: tuple, grid_yz: tuple[int, int] = (1, 1)) -> Launcher:
    """The launch `JITFunction.run` ends with, bound to one compiled kernel."""
    run, function, metadata = kernel.run, kernel.function, kernel.packed_metadata
    grid_y, grid_z = grid_yz

    def launch(grid: int, stream: int, args: tuple) -> None:
        run(grid, grid_y, grid_z, stream, function, metadata, None, None, None, *args, *tail)

    return launch


#: Codes of torch's static launcher for Triton's scalar types (pointers are "O").
_SCALAR_CODES = {"i1": "i", "i8": "b", "i16": "h", "i32": "i", "i64": "l", "u1": "I",
                 "u8": "B", "u16": "H", "u32": "I", "u64": "K", "fp16": "f", "bf16": "f",
                 "fp32": "f", "f32": "f", "fp64": "d"}


def static_launcher(kernel: Any, grid_yz: tuple[int, int] = (1, 1)) -> Launcher | None:
    """torch's C++ launcher for a Triton cubin (the one torch.compile launches its own Triton
    kernels with), bound to `kernel`: one C call per launch, where Triton's launcher runs
    Python around its C call. None where it does not apply (no such launcher in this torch,
    launch options it lacks, scratch memory, unknown argument types): Triton's launch is used.

    The cubin's parameters are the kernel's runtime arguments minus those Triton specialised
    into constants (an integer equal to 1), plus one null pointer per scratch buffer the
    compiled kernel declares (none of ours uses one).
    """
    try:
        from torch._C import _StaticCudaLauncher

        md, src = kernel.metadata, kernel.src
        if (getattr(md, "num_ctas", 1) != 1 or getattr(md, "launch_cooperative_grid", False)
                or getattr(md, "launch_pdl", False) or getattr(md, "tensordesc_meta", None)):
            return None
        scratch: list[None] = []
        for name in ("global_scratch_size", "profile_scratch_size"):
            if hasattr(md, name):
                if getattr(md, name):
                    return None
                scratch.append(None)
        names = list(src.fn.arg_names)

        def index(k: Any) -> int:
            return names.index(k) if isinstance(k, str) else k[0] if isinstance(k, tuple) else k

        signature = {index(k): v for k, v in src.signature.items()}
        constants = {index(k) for k in getattr(src, "constants", {})}
        keep = [i for i in sorted(signature)
                if signature[i] != "constexpr" and i not in constants]
        codes = "".join("O" if signature[i][0] == "*" else _SCALAR_CODES[signature[i]]
                        for i in keep) + "O" * len(scratch)
        launch_c, function = _StaticCudaLauncher._launch_kernel, kernel.function
        warps, shared, extra = md.num_warps, md.shared, tuple(scratch)
        grid_y, grid_z = grid_yz
        if len(keep) < 2:  # itemgetter returns a tuple only for two or more items
            return None
        pick = operator.itemgetter(*keep)
    except Exception:  # no such launcher, or a Triton whose metadata differs: Triton's launch
        return None

    def launch(grid: int, stream: int, args: tuple) -> None:
        launch_c(function, grid, grid_y, grid_z, warps, shared, codes, pick(args) + extra, stream)

    return launch
