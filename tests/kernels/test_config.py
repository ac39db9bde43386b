"""Typed configs (`kerneltune.kernels._config`) and how a spec reads the table's JSON into them
(`KernelSpec.parse`, `rejects`, `upgrade`): every config of a kernel's space goes to JSON and
back unchanged; whatever may not run is refused, naming the parameter; an older entry lacking
only the parameters added since parses to what it ran with; every shipped entry parses for its
own key, losslessly."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kerneltune import table as tbl
from kerneltune.kernels import (
    REGISTRY,
    BackwardConfig,
    ForwardConfig,
    KernelConfig,
    KernelSpec,
    Problem,
    QuantConfig,
    RowTilingConfig,
)

KERNELS = sorted(REGISTRY)
SHIPPED = sorted(tbl.shipped_tables_dir().glob("*.json"))
#: A problem whose default holds the row whole, in every kernel (BLOCK_N 8192).
PROBLEM = (4096, 5120)


def exactly(config: KernelConfig) -> list[tuple[str, type, Any]]:
    """A config's values with their types: `==` alone takes True for 1."""
    return [(name, type(value), value) for name, value in config.to_json().items()]


def default_json(spec: KernelSpec) -> tuple[Problem, dict[str, Any]]:
    problem = spec.problem(*PROBLEM)
    return problem, spec.default(problem).to_json()


# ------------------------------------------------------------------------- the types


def test_each_kernel_has_its_config_type() -> None:
    assert {name: spec.config_type for name, spec in REGISTRY.items()} == {
        "rmsnorm_fwd": ForwardConfig, "add_rmsnorm_fwd": RowTilingConfig,
        "rmsnorm_quant_fwd": QuantConfig, "rmsnorm_bwd": BackwardConfig,
        "layernorm_fwd": RowTilingConfig, "layernorm_bwd": BackwardConfig,
        "rmsnorm_group_quant_fwd": RowTilingConfig, "add_rmsnorm_group_quant_fwd": RowTilingConfig}


ROW_TILING = {"BLOCK_N": int, "SINGLE": bool, "ROWS": int, "EVICT": bool, "num_warps": int,
              "num_stages": int, "COOP": bool, "GRID_MULT": int}


@pytest.mark.parametrize(("kind", "types", "added"), [
    (RowTilingConfig, ROW_TILING, {"COOP": False, "GRID_MULT": 1}),
    (ForwardConfig, {**ROW_TILING, "LATE_RELEASE": bool},
     {"COOP": False, "GRID_MULT": 1, "LATE_RELEASE": False}),
    (QuantConfig, {**ROW_TILING, "PARTS": int, "X_LAYOUT": bool},
     {"COOP": False, "GRID_MULT": 1, "PARTS": 1, "X_LAYOUT": False}),
    (BackwardConfig, {"BLOCK_N": int, "SINGLE": bool, "PREFETCH": bool, "DW": str, "ROWS": int,
                      "GRID_MULT": int, "EVICT": bool, "num_warps": int, "num_stages": int},
     {"PREFETCH": False}),
], ids=lambda v: v.__name__ if isinstance(v, type) else "")
def test_fields_and_the_parameters_added_since(kind: type[KernelConfig], types: dict,
                                               added: dict) -> None:
    """Each field with its exact type, in the table's order; those with a default are the
    parameters older entries lack, with the value those ran with."""
    assert kind.field_types() == types
    assert list(kind.field_types()) == list(types)
    assert kind.added_since() == added
    assert all(type(v) is types[k] for k, v in kind.added_since().items())


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(("m", "n", "dtype"), [(1, 1, "float32"), (7, 100, "float16"),
                                               (4096, 5120, "bfloat16"),
                                               (65536, 262144, "bfloat16")])
def test_the_fields_are_the_space_and_of_its_types(kernel: str, m: int, n: int,
                                                   dtype: str) -> None:
    spec = REGISTRY[kernel]
    problem = spec.problem(m, n, dtype)
    space, types = spec.space(problem), spec.config_type.field_types()
    assert set(space) == set(types)
    assert all(type(v) is types[name] for name, choices in space.items() for v in choices)


def test_a_config_reads_as_its_json_map_but_equals_only_configs() -> None:
    spec = REGISTRY["rmsnorm_fwd"]
    config = spec.default(spec.problem(*PROBLEM))
    assert config["BLOCK_N"] == config.BLOCK_N == 8192
    assert dict(config) == config.to_json()
    assert list(config) == list(ForwardConfig.field_types()) and len(config) == 9
    with pytest.raises(KeyError, match="SPLIT"):
        config["SPLIT"]
    assert config != config.to_json() and config.to_json() != config
    assert config.launch_options == {"num_warps": config.num_warps,
                                     "num_stages": config.num_stages}
    assert repr(config) == f"ForwardConfig({config.to_json()})"
    # The same values in add + norm's type are add + norm's config, not the forward's.
    shared = {k: v for k, v in config.to_json().items() if k != "LATE_RELEASE"}
    assert RowTilingConfig(**shared) != config


@pytest.mark.parametrize("kernel", KERNELS)
def test_configs_are_frozen_and_hashable(kernel: str) -> None:
    spec = REGISTRY[kernel]
    problem = spec.problem(*PROBLEM)
    default = spec.default(problem)
    assert hash(default) == hash(spec.default(problem))
    assert {default: "tuned"}[spec.default(problem)] == "tuned"
    configs = [default, *spec.candidates(problem), default.replace(EVICT=not default.EVICT),
               default.replace(num_warps=1)]
    # A set holds each config once: as many as there are distinct values.
    assert len(set(configs)) == len({json.dumps(c.to_json()) for c in configs}) > 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        default.BLOCK_N = 1024
    with pytest.raises(dataclasses.FrozenInstanceError):
        del default.ROWS
    changed = default.replace(ROWS=1, num_warps=1)
    assert (changed.ROWS, changed.num_warps) == (1, 1)
    assert default == spec.default(problem)  # left as it was
    with pytest.raises(TypeError):
        default.replace(SPLIT=2)


# ----------------------------------------------------------------- round trips (a)


@st.composite
def problems(draw: st.DrawFn, spec: KernelSpec) -> Problem:
    m = draw(st.one_of(st.sampled_from([1, 2, 16, 256, 4096, 16384, 65536]),
                       st.integers(1, 1 << 17)))
    n = draw(st.one_of(st.sampled_from([1, 7, 64, 100, 1000, 4096, 5120, 7168, 32768, 65536,
                                        262144]), st.integers(1, 1 << 18)))
    dtype = draw(st.sampled_from(tbl.DTYPES))
    options = {k: draw(st.sampled_from(list(v))) for k, v in spec.options.items()}
    return spec.problem(m, n, dtype, **options)


@st.composite
def space_configs(draw: st.DrawFn, spec: KernelSpec, problem: Problem) -> KernelConfig:
    """A valid config of `problem`'s space (one of `spec.configs(problem)`, not enumerated): a
    value a parameter drawn from the space; where those together break the constraints (most
    do), each drawn value set in turn on a config a search starts from (the default or a
    candidate) wherever it keeps that valid, in a drawn order, twice over."""
    space = spec.space(problem)
    config = spec.config_type(**{name: draw(st.sampled_from(c)) for name, c in space.items()})
    if spec.valid(problem, config):
        return config
    config = draw(st.sampled_from([spec.default(problem), *spec.candidates(problem)]))
    order = draw(st.permutations(list(space)))
    for name in [*order, *order]:
        step = config.replace(**{name: draw(st.sampled_from(space[name]))})
        if spec.valid(problem, step):
            config = step
    return config


@pytest.mark.parametrize("kernel", KERNELS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_config_of_the_space_goes_to_json_and_back(kernel: str,
                                                          data: st.DataObject) -> None:
    spec = REGISTRY[kernel]
    problem = data.draw(problems(spec), label="problem")
    config = data.draw(space_configs(spec, problem), label="config")
    assert spec.valid(problem, config) and spec.rejects(problem, config) is None
    text = json.dumps(config.to_json())
    back = spec.config_type.from_json(json.loads(text))
    assert back == config and exactly(back) == exactly(config) and hash(back) == hash(config)
    parsed = spec.parse(problem, config.to_json())
    assert type(parsed) is spec.config_type
    assert parsed == config and exactly(parsed) == exactly(config)
    assert json.dumps(parsed.to_json()) == text


# ------------------------------------------------------------------------ refusals (b)

#: A change to a valid config's JSON that may not run, and what the refusal names: a value
#: outside the space, one of another type (no int for a bool, no bool, float or string for an
#: int), an unknown parameter.
REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"ROWS": -1}, "ROWS=-1"),
    ({"ROWS": 0}, "ROWS=0"),
    ({"ROWS": 32}, "ROWS=32"),
    ({"num_warps": 0}, "num_warps=0"),
    ({"num_warps": 3}, "num_warps=3"),
    ({"num_stages": 9}, "num_stages=9"),
    ({"BLOCK_N": 1000}, "BLOCK_N=1000"),
    ({"BLOCK_N": "256"}, "BLOCK_N='256'"),
    ({"BLOCK_N": 256.0}, "BLOCK_N=256.0"),
    ({"BLOCK_N": True}, "BLOCK_N=True"),
    ({"ROWS": True}, "ROWS=True"),
    ({"num_warps": None}, "num_warps=None"),
    ({"SINGLE": "false"}, "SINGLE='false'"),
    ({"SINGLE": 1}, "SINGLE=1"),
    ({"EVICT": 0}, "EVICT=0"),
    ({"GRID_MULT": 5}, "GRID_MULT=5"),
    ({"GRID_MULT": False}, "GRID_MULT=False"),
    ({"UNROLL": 2}, "unknown parameters ['UNROLL']"),
]
#: The same for a kernel's own parameters.
REFUSED_BY_KERNEL: dict[str, list[tuple[dict[str, Any], str]]] = {
    "rmsnorm_fwd": [({"COOP": 1}, "COOP=1"), ({"LATE_RELEASE": "yes"}, "LATE_RELEASE='yes'")],
    "add_rmsnorm_fwd": [({"COOP": 1}, "COOP=1"), ({"LATE_RELEASE": False},
                                                  "unknown parameters ['LATE_RELEASE']")],
    "rmsnorm_quant_fwd": [({"PARTS": 3}, "PARTS=3"), ({"PARTS": 2.0}, "PARTS=2.0"),
                          ({"X_LAYOUT": 0}, "X_LAYOUT=0")],
    "rmsnorm_bwd": [({"DW": "rows"}, "DW='rows'"), ({"DW": 0}, "DW=0"),
                    ({"PREFETCH": 0}, "PREFETCH=0"), ({"COOP": True},
                                                      "unknown parameters ['COOP']")],
    "layernorm_fwd": [({"COOP": True}, "COOP=True"), ({"LATE_RELEASE": False},
                                                     "unknown parameters ['LATE_RELEASE']")],
    "layernorm_bwd": [({"DW": "columns"}, "DW='columns'"), ({"PREFETCH": True},
                                                           "PREFETCH=True")],
    "rmsnorm_group_quant_fwd": [({"COOP": True}, "COOP=True"), ({"PARTS": 1},
                                                               "unknown parameters ['PARTS']")],
    "add_rmsnorm_group_quant_fwd": [({"COOP": True}, "COOP=True"), ({"X_LAYOUT": False},
                                                                   "unknown parameters "
                                                                   "['X_LAYOUT']")],
}
REFUSALS = [(kernel, change, named) for kernel in KERNELS
            for change, named in [*REFUSED, *REFUSED_BY_KERNEL[kernel]]]


@pytest.mark.parametrize(("kernel", "change", "named"), REFUSALS, ids=str)
def test_parse_refuses_what_may_not_run_and_names_it(kernel: str, change: dict,
                                                     named: str) -> None:
    spec = REGISTRY[kernel]
    problem, stored = default_json(spec)
    assert spec.parse(problem, stored) == spec.default(problem)
    with pytest.raises(ValueError) as refused:
        spec.parse(problem, {**stored, **change})
    assert named in str(refused.value)


@pytest.mark.parametrize("kernel", KERNELS)
def test_from_json_takes_each_value_of_exactly_its_fields_type(kernel: str) -> None:
    """`from_json` alone: a value of another type is refused, named, whatever the space."""
    spec = REGISTRY[kernel]
    _, stored = default_json(spec)
    kind = spec.config_type
    assert exactly(kind.from_json(stored)) == exactly(kind(**stored))
    for change, named in [({"ROWS": True}, "ROWS=True is not int"),
                          ({"BLOCK_N": 256.0}, "BLOCK_N=256.0 is not int"),
                          ({"BLOCK_N": "256"}, "BLOCK_N='256' is not int"),
                          ({"SINGLE": 1}, "SINGLE=1 is not bool"),
                          ({"SINGLE": "false"}, "SINGLE='false' is not bool")]:
        with pytest.raises(ValueError, match=f"^{kind.__name__}: .*{re.escape(named)}"):
            kind.from_json({**stored, **change})
    with pytest.raises(ValueError, match="a config is a JSON object, got list"):
        kind.from_json(list(stored.items()))


@pytest.mark.parametrize("kernel", KERNELS)
def test_an_entry_missing_a_parameter_older_entries_had_is_refused(kernel: str) -> None:
    """Only the parameters added since may be missing (no other is filled from the default):
    each other one missing is refused, named; a lone BLOCK_N names every one it lacks."""
    spec = REGISTRY[kernel]
    problem, stored = default_json(spec)
    added = spec.config_type.added_since()
    required = [name for name in stored if name not in added]
    assert "BLOCK_N" in required and "num_warps" in required
    for name in required:
        with pytest.raises(ValueError, match=rf"missing parameters \['{name}'\]"):
            spec.parse(problem, {k: v for k, v in stored.items() if k != name})
    with pytest.raises(ValueError, match="missing parameters") as refused:
        spec.parse(problem, {"BLOCK_N": 1024})
    assert all(f"'{name}'" in str(refused.value) for name in required if name != "BLOCK_N")
    assert not any(f"'{name}'" in str(refused.value) for name in added)


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_config_outside_the_constraints_is_refused(kernel: str) -> None:
    """Every value of the space, together not: a looped row of one block (BLOCK_N covers N)."""
    spec = REGISTRY[kernel]
    problem, stored = default_json(spec)
    assert stored["SINGLE"] is True and stored["BLOCK_N"] == 8192
    looped = {**stored, "SINGLE": False}
    assert spec.config_type.from_json(looped).SINGLE is False  # a config of the space
    with pytest.raises(ValueError, match=f"^{kernel}: the config does not fit 4096 x 5120 "
                                         "bfloat16$"):
        spec.parse(problem, looped)


@pytest.mark.parametrize("kernel", KERNELS)
def test_rejects_holds_a_typed_config_to_the_space_by_exact_type(kernel: str) -> None:
    """A typed config built in code (not from JSON) meets the same check: `rejects` names a
    value outside the space, or of another type though equal to one in it, and the
    constraints."""
    spec = REGISTRY[kernel]
    problem = spec.problem(*PROBLEM)
    default = spec.default(problem)
    assert spec.rejects(problem, default) is None
    assert (default.ROWS, default.BLOCK_N) == (1, 8192)
    evict = int(default.EVICT)
    for change, named in [({"ROWS": 1.0}, "ROWS=1.0 is not one of"),
                          ({"ROWS": True}, "ROWS=True is not one of"),
                          ({"BLOCK_N": 8192.0}, "BLOCK_N=8192.0 is not one of"),
                          ({"EVICT": evict}, f"EVICT={evict} is not one of"),
                          ({"num_warps": 3}, "num_warps=3 is not one of")]:
        why = spec.rejects(problem, default.replace(**change))
        assert why is not None and why.startswith(named), why
    assert spec.rejects(problem, default.replace(SINGLE=False)) == (
        "the config does not fit 4096 x 5120 bfloat16")


# -------------------------------------------------------------------- older entries (c)


#: Problems at which each kernel has a valid config with every added parameter at its default.
OLDER = [(4096, 5120), (1, 100), (2048, 32768), (4096, 16384)]


@pytest.mark.parametrize("kernel", KERNELS)
def test_an_older_entry_parses_with_the_added_parameters_as_it_ran(kernel: str) -> None:
    """A forward entry without LATE_RELEASE, COOP and GRID_MULT, quant's without PARTS and
    X_LAYOUT (and COOP, GRID_MULT), add + norm's without COOP and GRID_MULT, the backward's
    without PREFETCH: the config with those at their defaults."""
    spec = REGISTRY[kernel]
    added = spec.config_type.added_since()
    seen = 0
    for m, n in OLDER:
        problem = spec.problem(m, n)
        default = spec.default(problem)
        for config in [default, *spec.candidates(problem), default.replace(**added)]:
            if not spec.valid(problem, config) or any(
                    config[k] != v for k, v in added.items()):
                continue
            older = {k: v for k, v in config.to_json().items() if k not in added}
            assert spec.upgrade(problem, older) == config.to_json()
            assert type(spec.upgrade(problem, older)) is dict
            parsed = spec.parse(problem, older)
            assert parsed == config and exactly(parsed) == exactly(config)
            seen += 1
    assert seen >= len(OLDER)


@pytest.mark.parametrize("kernel", KERNELS)
def test_an_older_entry_keeps_what_it_stored(kernel: str) -> None:
    """An added parameter that an entry has is its own, not the default's; `upgrade` leaves
    its argument as it was."""
    spec = REGISTRY[kernel]
    problem, stored = default_json(spec)
    given = dict(stored)
    assert spec.upgrade(problem, given) == stored and given == stored
    flipped = {name: not v if isinstance(v, bool) else v + 1
               for name, v in spec.config_type.added_since().items()}
    assert spec.upgrade(problem, {**stored, **flipped}) == {**stored, **flipped}


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_forward_reads_the_split_it_replaced(kernel: str) -> None:
    """The forward's entries from before its cooperative split: SPLIT = 1 is the row tiling,
    a split row (SPLIT > 1) has no reading. No other kernel had SPLIT."""
    spec = REGISTRY[kernel]
    problem, stored = default_json(spec)
    if kernel == "rmsnorm_fwd":
        assert spec.parse(problem, {**stored, "SPLIT": 1}) == spec.default(problem)
        assert spec.upgrade(problem, {**stored, "SPLIT": 1}) == stored
        with pytest.raises(ValueError, match="SPLIT"):
            spec.parse(problem, {**stored, "SPLIT": 8})
    else:
        with pytest.raises(ValueError, match=r"unknown parameters \['SPLIT'\]"):
            spec.parse(problem, {**stored, "SPLIT": 1})


# -------------------------------------------------------------------- shipped tables (e)


def test_there_are_shipped_tables() -> None:
    assert SHIPPED


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_entry_parses_for_its_key_losslessly(path) -> None:
    entries = tbl.load(path).entries
    assert entries
    for e in entries:
        spec = REGISTRY[e.kernel]
        config = spec.parse(spec.problem(e.m, e.n, e.dtype), e.config)
        assert type(config) is spec.config_type, e.key
        assert config.to_json() == e.config, e.key
        # As JSON text too: `==` takes True for 1.
        assert json.dumps(config.to_json(), sort_keys=True) == json.dumps(e.config,
                                                                            sort_keys=True)


@pytest.mark.parametrize("data", [None, [1, 2], "BLOCK_N=64", 64])
def test_a_config_that_is_no_json_object_is_refused_by_parse(data):
    spec = REGISTRY["rmsnorm_fwd"]
    with pytest.raises(ValueError, match="JSON object"):
        spec.parse(spec.problem(4, 64), data)
