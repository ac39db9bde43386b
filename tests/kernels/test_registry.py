"""Every kernel of the registry: its hash covers its device code and nothing else."""

from __future__ import annotations

import importlib.util
import inspect
import sys

import pytest
from triton.runtime.jit import KernelInterface

from kerneltune.kernels import REGISTRY
from kerneltune.kernels._spec import device_code_hash


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_the_hash_covers_the_device_code_and_not_the_spec(name):
    spec = REGISTRY[name]
    device, own = spec.module, inspect.getmodule(type(spec))
    assert device is not own
    assert spec.kernel_hash == device_code_hash(device)
    jitted = [v for v in vars(device).values() if isinstance(v, KernelInterface)]
    assert jitted, f"{device.__name__} holds no Triton kernel"
    # The reference, the check, the space and the default live beside it, unhashed.
    for method in ("reference", "check", "space", "valid", "default", "make_inputs"):
        assert getattr(type(spec), method).__module__ != device.__name__, method
    assert not [n for n in vars(device) if n.endswith("_ref")]


DEVICE_MODULE = '''"""{doc}"""
import triton
import triton.language as tl

LAUNCH_VERSION = {launch}
SCALE = {scale}


@triton.jit
def _kernel(X, N, BLOCK: tl.constexpr):
    """{doc}"""
    cols = tl.arange(0, BLOCK)  # {doc}

    x = tl.load(X + cols, mask=cols < N)
    tl.store(X + cols, x * {body})


def launch(x):
    {host}
'''


def _hash_of(tmp_path, name: str, **fields: object) -> str:
    values = {"doc": "a", "launch": 1, "scale": 2.0, "body": "SCALE", "host": "return x"}
    path = tmp_path / f"{name}.py"
    path.write_text(DEVICE_MODULE.format(**{**values, **fields}))
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
        return device_code_hash(module)
    finally:
        del sys.modules[name]


@pytest.mark.parametrize(("change", "same"), [
    ({"doc": "other words"}, True),  # module and function docstrings, a comment
    ({"host": "return x + 1"}, True),  # host code outside the Triton functions
    ({"body": "SCALE * 1"}, False),
    ({"scale": 3.0}, False),  # a constant the kernel reads
    ({"launch": 2}, False),  # the launcher's description of the launch
])
def test_the_hash_follows_what_the_gpu_runs(tmp_path, change, same):
    base = _hash_of(tmp_path, "kt_device_base")
    changed = _hash_of(tmp_path, f"kt_device_{abs(hash(str(change)))}", **change)
    assert (changed == base) is same

