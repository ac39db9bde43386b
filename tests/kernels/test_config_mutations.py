"""Valid configs mutated (a value out of range, of the wrong type, negative or zero, a
non-power-of-two BLOCK_N, a parameter missing or unknown) and put wherever a config enters:

- the runtime, as the entry at the call's very key of the table named by KERNELTUNE_TABLE:
  every call's output equals the reference, and an entry the kernel refuses is passed over
  with one warning naming it;
- the service's `POST /api/v1/results`: every mutation outside the space is a 422 and nothing
  is stored; the others are stored;
- the launchers themselves, handed the mutated config as it is: a clear ValueError, or the
  right output, never uninitialized memory.

Small shapes (the kernels run under Triton's interpreter on a CPU).
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import torch
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.runtime_table import runtime_on_table

from kerneltune import runtime
from kerneltune.api.app import create_app
from kerneltune.api.settings import Settings
from kerneltune.kernels import REGISTRY, Inputs, KernelSpec, Outputs
from kerneltune.kernels.add_rmsnorm import describe_add_rmsnorm_fwd
from kerneltune.kernels.layernorm import describe_layernorm_fwd
from kerneltune.kernels.layernorm_bwd import describe_layernorm_bwd
from kerneltune.kernels.rmsnorm_bwd import describe_rmsnorm_bwd
from kerneltune.kernels.rmsnorm_fwd import describe_rmsnorm_fwd
from kerneltune.kernels.rmsnorm_group_quant import describe_rmsnorm_group_quant_fwd
from kerneltune.kernels.rmsnorm_quant import describe_rmsnorm_quant_fwd
from kerneltune.resolution import entry_refusal
from kerneltune.runtime import group_quant, ops
from kerneltune.runtime.layer_norm import _layer_norm_backward, _layer_norm_forward
from kerneltune.storage import make_engine, migrate
from kerneltune.table import Entry, Table, dumps, m_bucket

KERNELS = sorted(REGISTRY)
GPU = "NVIDIA Mutation Test GPU"
TOKEN = "mutation-write-token-0123456789"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
#: Each kernel's option for the calls (the runtime resolves with it).
OPTIONS: dict[str, dict[str, Any]] = {
    "rmsnorm_fwd": {"offset": 0.0}, "add_rmsnorm_fwd": {"offset": 0.0},
    "rmsnorm_bwd": {"offset": 0.0}, "rmsnorm_quant_fwd": {"quant": "int8"},
    "layernorm_fwd": {}, "layernorm_bwd": {},
    # One group a row: every N of the cases (16 and 48 hold no whole group of 32).
    "rmsnorm_group_quant_fwd": {"quant": "int8", "group_size": 0},
    "add_rmsnorm_group_quant_fwd": {"quant": "fp8", "group_size": 0},
}
EXAMPLES = 20


# ------------------------------------------------------------------------------ mutations


def _other_values(value: Any) -> st.SearchStrategy[Any]:
    """Values of another type than `value`'s: 256.0 or "256" for 256, 1 or "false" for False."""
    if isinstance(value, bool):
        return st.sampled_from([int(value), str(value).lower(), None])
    if isinstance(value, int):
        return st.sampled_from([float(value), str(value), True, None])
    return st.sampled_from([1, True, 1.5, None])


def _out_of_range(value: Any) -> st.SearchStrategy[Any]:
    if isinstance(value, bool):
        return st.sampled_from(["maybe"])
    if isinstance(value, int):
        return st.sampled_from([value * 2, value * 4, value + 1, 3, 5, 7, 64, 1 << 20])
    return st.sampled_from(["nowhere", value.upper()])


@st.composite
def mutations(draw: st.DrawFn, base: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(what was done, the mutated config JSON) of a valid config's JSON `base`."""
    name = draw(st.sampled_from(sorted(base)))
    value = base[name]
    kind = draw(st.sampled_from(["out of range", "wrong type", "missing", "extra", "negative",
                                 "zero", "non-power-of-two BLOCK_N"]))
    config = dict(base)
    if kind == "missing":
        del config[name]
    elif kind == "extra":
        config[draw(st.sampled_from(["EXTRA", "block_n", "SPLIT", "num_ctas"]))] = draw(
            st.sampled_from([0, 1, 2, True, "x"]))
    elif kind == "non-power-of-two BLOCK_N":
        block = base["BLOCK_N"]
        config["BLOCK_N"] = draw(st.sampled_from([block + block // 2, block - 1, 3 * block, 24]))
    else:
        strategy = {
            "out of range": _out_of_range(value),
            "wrong type": _other_values(value),
            "negative": st.just(-value if isinstance(value, int) and value else -1),
            "zero": st.just(0),
        }[kind]
        config[name] = draw(strategy)
    return f"{kind}: {name}", config


@st.composite
def cases(draw: st.DrawFn, kernel: str) -> tuple[KernelSpec, int, int, str, dict[str, Any]]:
    """A small call (M <= 4 rows, N <= 64) and a mutation of a valid config for its key."""
    spec = REGISTRY[kernel]
    m, n = draw(st.integers(1, 4)), draw(st.sampled_from([16, 32, 48, 64]))
    dtype = draw(st.sampled_from(["float32", "bfloat16"]))
    problem = spec.problem(m_bucket(m), n, dtype, **OPTIONS[kernel])
    base = draw(st.sampled_from(list(spec.configs(problem)))).to_json()
    _, config = draw(mutations(base))
    return spec, m, n, dtype, config


def entry_at(spec: KernelSpec, m: int, n: int, dtype: str, config: dict[str, Any]) -> Entry:
    return Entry(kernel=spec.name, dtype=dtype, n=n, m=m_bucket(m), config=config, us=1.0,
                 gbps=1.0, default_us=1.0, trials=1, kernel_hash=spec.kernel_hash)


def refusal(spec: KernelSpec, m: int, n: int, dtype: str, config: dict[str, Any]) -> str | None:
    entry = entry_at(spec, m, n, dtype, config)
    return entry_refusal(spec, entry, tuple(OPTIONS[spec.name].items()))


def inputs_for(spec: KernelSpec, m: int, n: int, dtype: str, seed: int = 0) -> Inputs:
    return spec.make_inputs(spec.problem(m, n, dtype, **OPTIONS[spec.name]), seed, DEVICE)


def through_runtime(spec: KernelSpec, i: Inputs) -> Outputs:
    """The kernel's outputs as the runtime's implementation of its public function gives them
    (the config resolved from the tables, then launched)."""
    if spec.name == "rmsnorm_fwd":
        return ops._rms_norm_forward(i["x"], i["weight"], i["eps"], i["offset"])
    if spec.name == "add_rmsnorm_fwd":
        return ops._add_rms_norm_forward(i["x"], i["residual"], i["weight"], i["eps"],
                                         i["offset"])
    if spec.name == "rmsnorm_bwd":
        return ops._rms_norm_backward(i["dy"], i["x"], i["weight"], i["rstd"], i["offset"])
    if spec.name == "layernorm_fwd":
        return _layer_norm_forward(i["x"], i["weight"], i["bias"], i["eps"])
    if spec.name == "layernorm_bwd":
        return _layer_norm_backward(i["dy"], i["x"], i["weight"], i["bias"], i["mean"],
                                    i["rstd"])
    if spec.name in ("rmsnorm_group_quant_fwd", "add_rmsnorm_group_quant_fwd"):
        return group_quant._forward(i["x"], i.get("residual"), i["weight"], i["eps"],
                                    i["quant"], i["group_size"], i["scale_ue8m0"],
                                    i["column_major_scales"])
    q, scale = ops._rms_norm_quant_forward(i["x"], i["weight"], i["bias"], i["eps"], i["quant"])
    return q, scale.reshape(-1)


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def table_file(tmp_path_factory) -> Iterator[Path]:
    """The runtime on a GPU of the tests' own, its one source the table at the returned path."""
    with runtime_on_table(tmp_path_factory.mktemp("mutations"), GPU) as path:
        yield path


@pytest.fixture(scope="module")
def client(tmp_path_factory) -> Iterator[TestClient]:
    url = f"sqlite:///{tmp_path_factory.mktemp('mutations-store') / 'kerneltune.db'}"
    engine = make_engine(url)
    migrate(engine)
    engine.dispose()
    with TestClient(create_app(Settings(database_url=url, write_token=TOKEN))) as c:
        yield c


_devices = itertools.count()
_slow = settings(max_examples=EXAMPLES, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ------------------------------------------------------------------------------ properties


@pytest.mark.parametrize("kernel", KERNELS)
def test_through_the_runtime_every_call_equals_the_reference(kernel, table_file):
    @_slow
    @given(case=cases(kernel), seed=st.integers(0, 2**16))
    def check(case, seed) -> None:
        spec, m, n, dtype, config = case
        table_file.write_text(dumps(Table(GPU, entries=[entry_at(spec, m, n, dtype, config)])))
        runtime.reset()
        inputs = inputs_for(spec, m, n, dtype, seed)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            outputs = through_runtime(spec, inputs)
        assert spec.check(inputs, outputs) is None, config
        messages = [str(w.message) for w in record
                    if issubclass(w.category, runtime.KerneltuneWarning)]
        why = refusal(spec, m, n, dtype, config)
        resolved = runtime.explain(kernel, (m, n, dtype), **OPTIONS[kernel])
        if None in config.values():  # no table holds a null: the file is refused whole
            assert resolved.match == "default" and len(messages) == 1
            assert "cannot use table" in messages[0]
        elif why is None:
            assert messages == [] and resolved.match == "exact", config
        else:
            assert resolved.match == "default", config
            (message,) = messages
            for part in (kernel, dtype, f"n={n}", f"m={m_bucket(m)}", str(table_file), why):
                assert part in message

    check()


@pytest.mark.parametrize("kernel", KERNELS)
def test_through_post_every_mutation_outside_the_space_is_refused(kernel, client):
    @_slow
    @given(case=cases(kernel))
    def check(case) -> None:
        spec, m, n, dtype, config = case
        device = f"Mutation GPU {next(_devices)}"
        entry = entry_at(spec, m, n, dtype, config)
        body = {"device": device, "entries": [{
            "kernel": entry.kernel, "dtype": dtype, "n": n, "m": entry.m, "config": config,
            "us": 1.0, "gbps": 1.0, "default_us": 1.0, "trials": 1,
            "kernel_hash": entry.kernel_hash}]}
        r = client.post("/api/v1/results", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
        stored = client.get(f"/api/v1/tables/{quote(device, safe='')}").status_code == 200
        # The service checks at the entry's key with the kernel's default options.
        if entry_refusal(spec, entry) is None:
            assert r.status_code == 200 and stored, (config, r.text)
        else:
            assert r.status_code == 422 and not stored, (config, r.text)
            for item in r.json()["detail"]:  # a null value fails each type a value may have
                assert item["loc"][:4] == ["body", "entries", 0, "config"], item

    check()


def _typed(spec: KernelSpec, config: dict[str, Any]) -> Any:
    """The mutated config as a typed one where its names allow (its values unchecked)."""
    full = {**spec.config_type.added_since(), **config}
    if set(full) != set(spec.config_type.field_types()):
        return None
    return spec.config_type(**full)


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_launchers_refuse_or_compute_right_whatever_they_are_handed(kernel):
    """No path from a config to uninitialized output: a launcher handed a config that was
    never checked either raises a ValueError before it launches or computes the reference."""
    @_slow
    @given(case=cases(kernel), seed=st.integers(0, 2**16))
    def check(case, seed) -> None:
        spec, m, n, dtype, config = case
        typed = _typed(spec, config)
        if typed is None:
            return
        inputs = inputs_for(spec, m, n, dtype, seed)
        try:
            outputs = spec.run(inputs, typed)
        except ValueError as e:
            assert "cannot launch" in str(e) or "persistent grid" in str(e), e
            return
        assert spec.check(inputs, outputs) is None, typed

    check()


# ------------------------------------------------------------------------------ launchers


def describe(spec: KernelSpec, m: int, n: int, config: Any, device: str = "meta") -> Any:
    """`spec`'s launch description on tensors of `device` (meta: nothing is launched)."""
    dtype = torch.bfloat16
    x, w = torch.empty(m, n, device=device, dtype=dtype), torch.empty(n, device=device,
                                                                       dtype=dtype)
    if spec.name == "rmsnorm_fwd":
        return describe_rmsnorm_fwd(x, w, 1e-6, 0.0, config)
    if spec.name == "add_rmsnorm_fwd":
        return describe_add_rmsnorm_fwd(x, x, w, 1e-6, 0.0, config)
    if spec.name == "rmsnorm_quant_fwd":
        return describe_rmsnorm_quant_fwd(x, w, None, 1e-6, "int8", config)
    if spec.name == "layernorm_fwd":
        return describe_layernorm_fwd(x, w, w, 1e-5, config)
    if spec.name == "layernorm_bwd":
        stats = torch.empty(m, device=device)
        return describe_layernorm_bwd(x, x, w, w, stats, stats, config)
    if spec.name in ("rmsnorm_group_quant_fwd", "add_rmsnorm_group_quant_fwd"):
        group = next((g for g in (128, 32) if n % g == 0), None)
        residual = x if spec.name.startswith("add") else None
        return describe_rmsnorm_group_quant_fwd(x, residual, w, 1e-6, "fp8", group, True, True,
                                                config)
    return describe_rmsnorm_bwd(x, x, w, torch.empty(m, device=device), 0.0, config)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("changes, named", [
    ({"ROWS": -1}, "ROWS=-1"),  # a negative grid: no program ran, the output uninitialized
    ({"ROWS": 0}, "ROWS=0"),  # a ZeroDivisionError
    ({"ROWS": 3}, "ROWS=3"),
    ({"ROWS": 2.0}, "ROWS=2.0"),
    ({"GRID_MULT": 0}, "GRID_MULT=0"),  # no programs, or a ZeroDivisionError
    ({"GRID_MULT": -1}, "GRID_MULT=-1"),
    ({"num_warps": 0}, "num_warps=0"),
    ({"num_warps": 3}, "num_warps=3"),
    ({"num_stages": 0}, "num_stages=0"),
    ({"BLOCK_N": 0}, "BLOCK_N=0"),
    ({"BLOCK_N": 48}, "BLOCK_N=48"),
    ({"BLOCK_N": "64"}, "BLOCK_N='64'"),
    ({"BLOCK_N": 16}, "a whole row in one block of BLOCK_N=16 < 64"),  # columns left unwritten
])
def test_the_launchers_refuse_what_they_cannot_run(kernel, changes, named):
    spec = REGISTRY[kernel]
    problem = spec.problem(4, 64, "float32", **OPTIONS[kernel])
    config = spec.default(problem).replace(**changes)
    assert config.SINGLE  # the default holds the row whole at this size
    with pytest.raises(ValueError, match="cannot launch") as refused:
        spec.run(inputs_for(spec, 4, 64, "float32"), config)
    assert named in str(refused.value)


def test_the_backward_refuses_a_dw_mode_it_does_not_have():
    spec = REGISTRY["rmsnorm_bwd"]
    config = spec.default(spec.problem(4, 64, "float32")).replace(DW="nowhere")
    with pytest.raises(ValueError, match="DW='nowhere' is not one of"):
        describe(spec, 4, 64, config)


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_config_of_the_space_passes_the_launchers_floor(kernel):
    """The launchers' own check refuses nothing a kernel's space holds (whole rows in two
    parts, splits, looped rows, persistent grids), at short, long and uneven rows."""
    spec = REGISTRY[kernel]
    count = 0
    for m, n in itertools.product((1, 64, 4096), (16, 48, 5120, 40000)):
        problem = spec.problem(m, n, "bfloat16", **OPTIONS[kernel])
        for config in spec.configs(problem):
            describe(spec, m, n, config)
            count += 1
    assert count > 100
