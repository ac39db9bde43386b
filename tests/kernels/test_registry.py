"""Every kernel of the registry: its hash covers its device code and nothing else."""

from __future__ import annotations

import inspect

import pytest
from triton.runtime.jit import KernelInterface

from kerneltune.kernels import REGISTRY
from kerneltune.kernels._spec import source_hash


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_the_hash_covers_the_device_code_and_not_the_spec(name):
    spec = REGISTRY[name]
    device, own = spec.module, inspect.getmodule(type(spec))
    assert device is not own
    assert spec.kernel_hash == source_hash(device)
    jitted = [v for v in vars(device).values() if isinstance(v, KernelInterface)]
    assert jitted, f"{device.__name__} holds no Triton kernel"
    # The reference, the check, the space and the default live beside it, unhashed.
    for method in ("reference", "check", "space", "valid", "default", "make_inputs"):
        assert getattr(type(spec), method).__module__ != device.__name__, method
    assert not [n for n in vars(device) if n.endswith("_ref")]
