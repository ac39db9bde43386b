"""Every kernel of the registry: its hash covers its device code and nothing else; kernels of
other distributions join the registry through the entry-point group `kerneltune.kernels`."""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
import tomllib
import warnings
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import pytest
from triton.runtime.jit import KernelInterface

from kerneltune.kernels import BUILTINS, REGISTRY, _plugins
from kerneltune.kernels._plugins import (
    GROUP,
    OWN,
    KernelPluginWarning,
    installed_entries,
    register_plugins,
    specs_of,
)
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



# ------------------------------------------------------------------------- plug-ins

PLUGIN = '''
from kerneltune.kernels.layernorm_spec import LayerNormFwd


class DemoNorm(LayerNormFwd):
    name = "demo_norm_fwd"


class Clash(LayerNormFwd):
    name = "rmsnorm_fwd"


SPEC = DemoNorm()
CLASH = Clash()
NOT_A_SPEC = 42
'''

ENTRY_POINTS = """[kerneltune.kernels]
demo = kt_demo_plugin:SPEC
broken = kt_demo_broken:SPECS
clash = kt_demo_plugin:CLASH
nothing = kt_demo_plugin:NOT_A_SPEC
"""

#: Run with the throwaway distribution on sys.path: what the registry holds and which
#: warnings the import gave; then the demo kernel resolved and run as a built-in one is.
PROBE = """
import json, warnings
with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    from kerneltune import kernels
import torch
import kt_demo_plugin
from kerneltune import runtime
spec = kernels.get_spec("demo_norm_fwd")
problem = spec.problem(3, 40, "float32")
inputs = spec.make_inputs(problem, 0, "cpu")
print(json.dumps({
    "names": sorted(kernels.REGISTRY),
    "demo": spec is kt_demo_plugin.SPEC,
    "rmsnorm_fwd": type(kernels.REGISTRY["rmsnorm_fwd"]).__module__,
    "warnings": [f"{w.category.__name__}: {w.message}" for w in record],
    "match": runtime.explain("demo_norm_fwd", (3, 40, "float32")).match,
    "check": spec.check(inputs, spec.run(inputs, spec.default(problem))),
}))
"""


def _with_plugins(tmp_path, entry_points: str) -> dict:
    """The probe's findings in a fresh interpreter with a throwaway distribution installed at
    `tmp_path` (its metadata, its entry points and its modules on sys.path)."""
    dist = tmp_path / "kt_demo_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kt-demo-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(entry_points)
    (tmp_path / "kt_demo_plugin.py").write_text(PLUGIN)
    (tmp_path / "kt_demo_broken.py").write_text('raise RuntimeError("half-installed")\n')
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         env=env, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_plugin_kernel_joins_the_registry_and_broken_ones_are_skipped(tmp_path):
    found = _with_plugins(tmp_path, ENTRY_POINTS)
    assert found["demo"] is True and found["check"] is None
    assert found["match"] == "default"  # resolved as any kernel nothing was tuned for
    shipped_plugins = [spec.name for e in entry_points(group=GROUP)
                       if e.value.startswith("kerneltune.") for spec in specs_of(e) or ()]
    assert {"layernorm_fwd", "rmsnorm_group_quant_fwd"} <= set(shipped_plugins)
    assert found["names"] == sorted([*BUILTINS, *shipped_plugins, "demo_norm_fwd"])
    assert found["rmsnorm_fwd"] == "kerneltune.kernels.rmsnorm_fwd_spec"  # not the clash
    prefix = "KernelPluginWarning: kerneltune: kernel plug-in"
    assert sorted(found["warnings"]) == [
        f"{prefix} 'broken' (kt_demo_broken:SPECS) skipped: it failed to load "
        "(RuntimeError: half-installed)",
        f"{prefix} 'clash' (kt_demo_plugin:CLASH) skipped: its kernel 'rmsnorm_fwd' has the "
        "name of a built-in kernel",
        f"{prefix} 'nothing' (kt_demo_plugin:NOT_A_SPEC) skipped: it names a int, not a "
        "KernelSpec with a name, or a list of them",
    ]


def _entry(name: str, value: str) -> EntryPoint:
    return EntryPoint(name, value, GROUP)


def test_a_name_is_registered_once(tmp_path, monkeypatch):
    """A spec seen again (a distribution found twice on sys.path) is no clash; another spec of
    a name already taken is, and the first one stays."""
    (tmp_path / "kt_other_norm.py").write_text(
        "from kerneltune.kernels.layernorm_spec import LayerNormFwd\nSPEC = LayerNormFwd()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = {"rmsnorm_fwd": REGISTRY["rmsnorm_fwd"]}
    layernorm = _entry("layernorm", "kerneltune.kernels.layernorm_spec:SPECS")
    other = _entry("other", "kt_other_norm:SPEC")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        register_plugins(registry, BUILTINS, [layernorm, layernorm])
        assert record == []
        register_plugins(registry, BUILTINS, [_entry("copy", "copy:deepcopy")])
        register_plugins(registry, BUILTINS, [other])
    assert registry["layernorm_fwd"] is REGISTRY["layernorm_fwd"]
    assert sorted(registry) == ["layernorm_bwd", "layernorm_fwd", "rmsnorm_fwd"]
    assert [str(w.message) for w in record] == [
        "kerneltune: kernel plug-in 'copy' (copy:deepcopy) skipped: it names a function, not "
        "a KernelSpec with a name, or a list of them",
        "kerneltune: kernel plug-in 'other' (kt_other_norm:SPEC) skipped: its kernel "
        "'layernorm_fwd' is already registered, by kerneltune.kernels.layernorm_spec",
    ]
    assert all(w.category is KernelPluginWarning for w in record)


def test_an_empty_list_of_kernels_is_refused():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert specs_of(_entry("none", "kerneltune.kernels:BUILTINS")) is None
    (warning,) = record
    assert "it names a frozenset, not a KernelSpec" in str(warning.message)


def test_kerneltunes_own_plugins_load_from_a_source_checkout_too(monkeypatch):
    """`OWN` is what pyproject.toml declares; without installed metadata (a source checkout on
    PYTHONPATH, as on a machine the project is only copied to) they still join the registry,
    and an installed distribution's entry points are not taken twice."""
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"][GROUP] == OWN
    monkeypatch.setattr(_plugins, "entry_points", lambda group: [])
    registry = {name: REGISTRY[name] for name in BUILTINS}
    register_plugins(registry, BUILTINS)
    assert {"layernorm_fwd", "layernorm_bwd", "rmsnorm_group_quant_fwd",
            "add_rmsnorm_group_quant_fwd"} <= set(registry)
    monkeypatch.setattr(_plugins, "entry_points",
                        lambda group: [_entry("layernorm", OWN["layernorm"])])
    assert [e.value for e in installed_entries()] == list(OWN.values())
