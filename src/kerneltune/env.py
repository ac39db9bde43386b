"""What this process runs on: the device's model name and the software versions.

Results measured under the Triton interpreter are filed under `INTERPRETER_DEVICE`, never under a
GPU's name, so CPU timings are not mixed with a GPU's.
"""

from __future__ import annotations

import functools
import platform
import subprocess

import torch
import triton

from kerneltune.kernels._spec import interpreting
from kerneltune.table import INTERPRETER_DEVICE, Env


def on_gpu() -> bool:
    """Whether kernels run on a CUDA GPU (not the interpreter)."""
    return torch.cuda.is_available() and not interpreting()


def device_name(index: int | None = None) -> str:
    """The GPU model name as the driver reports it, or the interpreter's label on a CPU."""
    if not on_gpu():
        return INTERPRETER_DEVICE
    return torch.cuda.get_device_name(torch.cuda.current_device() if index is None else index)


def compute_capability(index: int | None = None) -> str | None:
    """The GPU's CUDA compute capability as tables write it ("9.0"); None off a GPU."""
    if not on_gpu():
        return None
    major, minor = torch.cuda.get_device_capability(index)
    return f"{major}.{minor}"


@functools.cache
def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def environment() -> Env:
    """Versions that a measurement depends on."""
    gpu = on_gpu()
    return Env(
        triton=triton.__version__,
        torch=torch.__version__,
        cuda=torch.version.cuda if gpu else None,
        driver=_driver_version() if gpu else None,
        python=platform.python_version(),
    )
