"""RMSNorm + per-token-group quantisation (fp8 e4m3, int8), alone and residual-fused, under the
Triton interpreter; and one tuning run of it, as a kernel registered through its entry point."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from offline import compiled_offline
from typer.testing import CliRunner

from kerneltune import runtime, table
from kerneltune.cli import app
from kerneltune.kernels import BUILTINS, REGISTRY, RowTilingConfig
from kerneltune.kernels._spec import as_rows
from kerneltune.kernels.rmsnorm_group_quant import GROUP_SIZES, rmsnorm_group_quant_fwd
from kerneltune.kernels.rmsnorm_group_quant_spec import (
    ADD_FWD,
    FWD,
    SPECS,
    group_of,
)
from kerneltune.kernels.rmsnorm_quant import FP8_MAX, INT8_MIN_SCALE, rmsnorm_quant_fwd
from kerneltune.kernels.rmsnorm_quant_spec import SPEC as PER_TOKEN
from kerneltune.table import INTERPRETER_DEVICE

DTYPES = ["float32", "float16", "bfloat16"]
QUANTS = ["fp8", "int8"]
QTYPES = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}
IDS = {FWD.name: "norm", ADD_FWD.name: "add"}


def _inputs(spec, m: int, n: int, dtype: str = "bfloat16", seed: int = 0, **options) -> dict:
    return spec.make_inputs(spec.problem(m, n, dtype, **options), seed, "cpu")


def _run(inputs: dict, config: RowTilingConfig, **changes) -> tuple[torch.Tensor, ...]:
    i = {**inputs, **changes}
    return rmsnorm_group_quant_fwd(i["x"], i.get("residual"), i["weight"], i["eps"], i["quant"],
                                   i["group_size"], i["scale_ue8m0"], i["column_major_scales"],
                                   config)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t


def test_registered_through_the_entry_point_not_as_built_ins() -> None:
    assert [s.name for s in SPECS] == ["rmsnorm_group_quant_fwd", "add_rmsnorm_group_quant_fwd"]
    for spec in SPECS:
        assert REGISTRY[spec.name] is spec and spec.name not in BUILTINS
        assert spec.options["quant"] == ("fp8", "int8")
        assert spec.options["group_size"][0] == 128
    assert FWD.kernel_hash == ADD_FWD.kernel_hash  # one device module


@pytest.mark.parametrize("spec", SPECS, ids=IDS.get)
@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "group"), [(1, 128, 128), (7, 384, 64), (5, 96, 32)])
def test_default_config_matches_reference(spec, quant: str, dtype: str, m: int, n: int,
                                          group: int) -> None:
    problem = spec.problem(m, n, dtype, quant=quant, group_size=group)
    inputs = spec.make_inputs(problem, seed=m + n, device="cpu")
    out = spec.run(inputs, spec.default(problem))
    assert len(out) == (3 if spec is ADD_FWD else 2)
    assert out[0].dtype == QTYPES[quant] and out[0].shape == (m, n)
    assert out[1].dtype == torch.float32 and out[1].shape == (m, n // group)
    assert spec.check(inputs, out) is None
    if dtype != "float32":  # (in fp32, r and so the scales may differ from the reference's by ulps)
        ref = spec.reference(inputs)
        assert torch.equal(_bits(out[0]), _bits(ref[0])) and torch.equal(out[1], ref[1])


@pytest.mark.parametrize("spec", SPECS, ids=IDS.get)
@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("group", [32, 256, 0])
def test_looped_and_persistent_configs(spec, quant: str, group: int) -> None:
    """Chunks of 512 over a row of 1536 (whole groups each; one group a row takes a pass for
    its max), and whole rows on a persistent grid of fewer programs than row blocks."""
    problem = spec.problem(5, 1536, "bfloat16", quant=quant, group_size=group)
    inputs = spec.make_inputs(problem, seed=group, device="cpu")
    default = spec.default(problem)
    looped = default.replace(SINGLE=False, BLOCK_N=512, ROWS=1, num_warps=2)
    persistent = default.replace(ROWS=1, GRID_MULT=2)
    for config in (looped, persistent):
        assert spec.rejects(problem, config) is None, config
        out = spec.run(inputs, config)
        assert spec.check(inputs, out) is None, config
        assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(
            out, spec.run(inputs, default), strict=True)), config


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("single", [True, False])
def test_one_group_a_row_is_the_per_token_kernel_bit_for_bit(quant: str, dtype: str,
                                                             single: bool) -> None:
    """group_size None: rmsnorm_quant_fwd's q and scale exactly (its floors, its rounding), at
    the same tiling."""
    m, n = 6, 1000
    inputs = _inputs(FWD, m, n, dtype, seed=3, quant=quant, group_size=0)
    assert inputs["group_size"] is None
    per_token = PER_TOKEN.default(PER_TOKEN.problem(m, n, dtype, quant=quant))
    if not single:
        per_token = per_token.replace(SINGLE=False, BLOCK_N=512, ROWS=1)
    config = RowTilingConfig(**{k: per_token[k] for k in RowTilingConfig.field_types()})
    q, scales = _run(inputs, config)
    q_ref, s_ref = rmsnorm_quant_fwd(inputs["x"], inputs["weight"], None, 1e-6, quant,
                                     per_token)
    assert scales.shape == (m, 1)
    assert torch.equal(_bits(q), _bits(q_ref)) and torch.equal(scales[:, 0], s_ref)


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("ue8m0", [False, True])
def test_the_floors_are_the_per_token_modes(quant: str, ue8m0: bool) -> None:
    """A group of zeros gets the floor: fp32 eps for int8, 1 / (448 · 512) for fp8, each
    rounded up to a power of two with UE8M0 (2^-23 is one; 1 / (448 · 512) goes to 2^-17)."""
    inputs = _inputs(FWD, 3, 256, "float32", quant=quant, group_size=128, scale_ue8m0=ue8m0)
    inputs["x"][1, 128:] = 0.0
    _, scales = _run(inputs, FWD.default(FWD.problem(3, 256, "float32")))
    floor = INT8_MIN_SCALE if quant == "int8" else 1.0 / (FP8_MAX * 512.0)
    if ue8m0:
        floor = 2.0 ** -23 if quant == "int8" else 2.0 ** -17
    assert scales[1, 1].item() == torch.tensor(floor, dtype=torch.float32).item()
    assert (scales[:, 0] > floor).all()


@pytest.mark.parametrize("spec", SPECS, ids=IDS.get)
@pytest.mark.parametrize("quant", QUANTS)
def test_ue8m0_scales_are_exact_powers_of_two(spec, quant: str) -> None:
    inputs = _inputs(spec, 9, 512, "bfloat16", seed=5, quant=quant, group_size=64,
                     scale_ue8m0=True)
    out = spec.run(inputs, spec.default(spec.problem(9, 512)))
    mantissa, _ = torch.frexp(out[1])
    assert (mantissa == 0.5).all()
    plain = _run(inputs, spec.default(spec.problem(9, 512)), scale_ue8m0=False)
    assert (out[1] >= plain[1]).all() and (out[1] < 2 * plain[1]).all()
    assert spec.check(inputs, out) is None
    ref = spec.reference(inputs)
    assert torch.equal(_bits(out[0]), _bits(ref[0])) and torch.equal(out[1], ref[1])


@pytest.mark.parametrize("spec", SPECS, ids=IDS.get)
def test_column_major_scales(spec) -> None:
    """Strides (1, M); the same values as row-major ones."""
    m, n = 7, 384
    inputs = _inputs(spec, m, n, "float16", seed=2, quant="fp8", group_size=128,
                     column_major_scales=True)
    config = spec.default(spec.problem(m, n, "float16"))
    out = spec.run(inputs, config)
    assert out[1].shape == (m, 3) and out[1].stride() == (1, m)
    assert spec.check(inputs, out) is None
    rows = _run(inputs, config, column_major_scales=False)
    assert rows[1].stride() == (3, 1) and torch.equal(out[1], rows[1])


def test_int8_rounds_half_to_even_in_each_group() -> None:
    """r = 1/2 exactly; in both groups of 32 max|y| = 127/32, s = 1/32, and y / s falls on the
    ties 15.5, ±2.5, 1.5."""
    x = torch.zeros(1, 64)
    tie = torch.tensor([127 / 16, 31 / 32, 5 / 32, -5 / 32, 3 / 32])
    x[0, :5] = x[0, 32:37] = tie
    x[0, 37:45] = 4.0
    assert x.pow(2).mean().item() == 4.0
    q, scales = rmsnorm_group_quant_fwd(x, None, torch.ones(64), 0.0, "int8", 32, False, False,
                                        FWD.default(FWD.problem(1, 64, "float32")))
    assert scales.tolist() == [[1 / 32, 1 / 32]]
    assert q[0, :5].tolist() == q[0, 32:37].tolist() == [127, 16, 2, -2, 2]
    assert q[0, 37:45].tolist() == [64] * 8 and not q[0, 5:32].any() and not q[0, 45:].any()


@pytest.mark.parametrize("spec", SPECS, ids=IDS.get)
def test_leading_dimensions_and_strided_rows(spec) -> None:
    g = torch.Generator().manual_seed(4)
    x3 = torch.randn(2, 3, 256, generator=g).to(torch.bfloat16)
    wide = torch.randn(2, 3, 400, generator=g).to(torch.bfloat16)
    w = (torch.rand(256, generator=g) + 0.5).to(torch.bfloat16)
    residual = as_rows(wide[..., 100:356]) if spec is ADD_FWD else None  # rows strided by 400
    x = as_rows(x3)
    assert x.shape == (6, 256) and (residual is None or residual.stride() == (400, 1))
    for quant in QUANTS:
        inputs = {"x": x, "residual": residual, "weight": w, "eps": 1e-6, "quant": quant,
                  "group_size": 128, "scale_ue8m0": False, "column_major_scales": False}
        for config in (spec.default(spec.problem(6, 256)),
                       spec.default(spec.problem(6, 256)).replace(ROWS=1)):
            out = spec.run(inputs, config)
            assert spec.check(inputs, out) is None
            ref = spec.reference(inputs)
            assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(out, ref, strict=True))
    strided_x = as_rows(wide[..., 50:306])
    inputs = {"x": strided_x, "weight": w, "eps": 1e-6, "quant": "int8", "group_size": 64,
              "scale_ue8m0": False, "column_major_scales": True,
              **({"residual": x} if spec is ADD_FWD else {})}
    out = spec.run(inputs, spec.default(spec.problem(6, 256)).replace(SINGLE=False, BLOCK_N=128))
    assert spec.check(inputs, out) is None


def test_the_residual_variant_returns_the_rounded_sum() -> None:
    inputs = _inputs(ADD_FWD, 5, 256, "bfloat16", seed=7, quant="fp8", group_size=128)
    q, scales, s = ADD_FWD.run(inputs, ADD_FWD.default(ADD_FWD.problem(5, 256)))
    x, res = inputs["x"], inputs["residual"]
    assert s.dtype == x.dtype and torch.equal(s, (x.float() + res.float()).to(x.dtype))
    q_norm, s_norm = _run({**inputs, "x": s, "residual": None},
                          FWD.default(FWD.problem(5, 256)))
    assert torch.equal(_bits(q), _bits(q_norm)) and torch.equal(scales, s_norm)


@pytest.mark.parametrize("spec", SPECS, ids=IDS.get)
def test_empty(spec) -> None:
    inputs = _inputs(spec, 1, 256, quant="int8")
    inputs = {k: v[:0] if k in ("x", "residual") else v for k, v in inputs.items()}
    out = _run(inputs, spec.default(spec.problem(1, 256)))
    assert out[0].shape == (0, 256) and out[1].shape == (0, 2)


@pytest.mark.parametrize(("changes", "match"), [
    ({"group_size": 48}, "group_size must be one of"),
    ({"group_size": 512}, "group_size must be one of"),
    ({"group_size": True}, "group_size must be one of"),
    ({"group_size": 256, "x_n": 384}, "384 is not a multiple of group_size=256"),
    ({"quant": "fake"}, "quant must be one of"),
])
def test_bad_arguments(changes: dict, match: str) -> None:
    n = changes.pop("x_n", 256)
    inputs = _inputs(FWD, 3, n, quant="fp8", group_size=128 if n % 128 == 0 else 0)
    with pytest.raises(ValueError, match=match):
        _run(inputs, FWD.default(FWD.problem(3, n)), **changes)


def test_configs_it_cannot_run_are_refused() -> None:
    inputs = _inputs(FWD, 3, 1024, quant="fp8", group_size=256)
    default = FWD.default(FWD.problem(3, 1024))
    with pytest.raises(ValueError, match="splits no row"):
        _run(inputs, default.replace(COOP=True))
    with pytest.raises(ValueError, match="holds no whole group"):
        _run(inputs, default.replace(SINGLE=False, BLOCK_N=128))
    with pytest.raises(ValueError, match="cannot launch"):
        _run(inputs, default.replace(BLOCK_N=512))


@pytest.mark.parametrize("spec", SPECS, ids=IDS.get)
def test_detects_wrong_output(spec) -> None:
    inputs = _inputs(spec, 4, 256, "bfloat16", seed=1, quant="int8", group_size=64)
    out = spec.run(inputs, spec.default(spec.problem(4, 256)))
    assert spec.check(inputs, out) is None
    scales = out[1].clone()
    scales[2, 1] *= 1.01
    assert "scale of row 2, group 1" in spec.check(inputs, (out[0], scales, *out[2:]))
    q = out[0].clone()
    q[3, 70] = q[3, 70] + 2 if q[3, 70] < 100 else q[3, 70] - 2
    assert "not a rounding" in spec.check(inputs, (q, *out[1:]))
    if spec is ADD_FWD:
        assert "2 outputs, expected 3" in spec.check(inputs, out[:2])
        s = out[2].clone()
        s[0, 0] += 1
        assert "new residual" in spec.check(inputs, (*out[:2], s))


def test_a_key_serves_fp8_and_int8_at_a_group_its_n_takes() -> None:
    assert [(p.option("quant", None), p.option("group_size", None))
            for p in FWD.served(FWD.problem(64, 4096))] == [("fp8", 128), ("int8", 128)]
    assert group_of(FWD.problem(1, 4096 + 64)) == 64
    assert group_of(FWD.problem(1, 100)) is None  # no group divides it: one a row
    assert [p.option("group_size", None) for p in ADD_FWD.served(ADD_FWD.problem(1, 100))] == [
        0, 0]
    asked = FWD.problem(1, 4096, quant="int8", group_size=32)
    assert FWD.served(asked) == [asked] and group_of(asked) == 32


def test_bytes_moved() -> None:
    m, n = 8, 4096
    assert FWD.bytes_moved(FWD.problem(m, n, quant="fp8", group_size=128)) == (
        m * n * 2 + m * n + n * 2 + 4 * m * 32)
    assert ADD_FWD.bytes_moved(ADD_FWD.problem(m, n, "float32", group_size=0)) == (
        3 * m * n * 4 + m * n + n * 4 + 4 * m)


@pytest.mark.parametrize("spec", SPECS, ids=IDS.get)
@pytest.mark.parametrize(("m", "n"), [(1, 1), (3, 96), (4096, 5120), (64, 262144)])
def test_default_is_valid(spec, m: int, n: int) -> None:
    problem = spec.problem(m, n)
    config = spec.default(problem)
    assert spec.rejects(problem, config) is None
    assert not any(c.COOP for c in spec.configs(spec.problem(m, min(n, 8192))))


_COMPILED = """
import sys
sys.path.insert(0, sys.argv[1])
from sass_mix import hopper_registers
from kerneltune.kernels.rmsnorm_group_quant import _rmsnorm_group_quant_kernel
base = {"X": "*bf16", "RES": "*bf16", "RES_OUT": "*bf16", "W": "*bf16", "Q": "*fp8e4nv",
        "S": "*fp32", "stride_x": "i32", "stride_r": "i32", "stride_o": "i32", "stride_q": "i32",
        "stride_sr": "i32", "stride_sg": "i32", "M": "i32", "N": "i32", "n_groups": "i32",
        "eps": "fp32", "min_scale": "fp32"}
for single, group, per_row, res, mode, ue8m0 in [
        (True, 128, False, False, 1, True), (True, 4096, True, False, 0, False),
        (False, 128, False, True, 1, False), (False, 1024, True, True, 0, True),
        (True, 32, False, True, 0, True)]:
    sig = {**base, "Q": "*fp8e4nv" if mode == 1 else "*i8"}
    print(hopper_registers(_rmsnorm_group_quant_kernel, sig, {
        "BLOCK_N": 4096 if single else 1024, "ROWS": 1, "SINGLE": single, "GROUP": group,
        "PER_ROW": per_row, "HAS_RES": res, "EVICT": True, "MODE": mode,
        "QMAX": 448.0 if mode == 1 else 127.0, "UE8M0": ue8m0, "SOFT_ROUND": False,
        "PDL": True}, 4))
"""


def test_every_path_compiles_for_hopper_within_the_registers() -> None:
    """Off the interpreter: whole rows of groups and of one group, looped rows of groups and
    of one group (a pass for its max), with and without a residual, fp8 and int8, UE8M0,
    compiled for sm_90 (offline), each in a thread's 255 registers."""
    registers = [int(v) for v in compiled_offline(_COMPILED).split()]
    assert len(registers) == 5 and all(0 < r < 255 for r in registers), registers


@st.composite
def _cases(draw: st.DrawFn):
    spec = draw(st.sampled_from(SPECS))
    m = draw(st.sampled_from([1, 3, 5, 17]))
    n, dtype = draw(st.sampled_from([(64, "float32"), (96, "bfloat16"), (640, "float16"),
                                     (1536, "bfloat16"), (100, "float16")]))
    group = draw(st.sampled_from([g for g in GROUP_SIZES if n % g == 0] + [0]))
    problem = spec.problem(m, n, dtype, quant=draw(st.sampled_from(QUANTS)), group_size=group,
                           scale_ue8m0=draw(st.booleans()),
                           column_major_scales=draw(st.booleans()))
    config = draw(st.sampled_from(list(spec.configs(problem))))
    return spec, config, spec.make_inputs(problem, draw(st.integers(0, 2**16)), "cpu")


@settings(max_examples=20, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(case=_cases())
def test_any_config_of_the_space_is_correct(case) -> None:
    spec, config, inputs = case
    assert spec.check(inputs, spec.run(inputs, config)) is None, config


def test_tuned_stored_and_resolved_exactly(tmp_path, sqlite_url) -> None:
    """`kerneltune tune` searches both kernels (under the interpreter, a tiny shape), `export
    --current` keeps them, and the runtime, reading this machine's own table, resolves each
    key exactly."""
    runner = CliRunner()
    result = runner.invoke(app, ["tune", "-k", FWD.name, "-k", ADD_FWD.name, "-d", "float32",
                                 "-n", "64", "-m", "1", "--trials", "2", "--retime-rounds", "1",
                                 "--no-progress", "--db", sqlite_url])
    assert result.exit_code == 0, result.output
    assert "2 tuned, 0 already done, 0 failed, 0 incomplete" in result.output
    out = tmp_path / "table.json"
    result = runner.invoke(app, ["export", "--device", INTERPRETER_DEVICE, "--current", "-o",
                                 str(out), "--db", sqlite_url])
    assert result.exit_code == 0, result.output
    entries = {e.kernel: e for e in table.load(out).entries}
    assert sorted(entries) == sorted(s.name for s in SPECS)
    runtime.reset()
    try:
        for spec in SPECS:
            e = entries[spec.name]
            assert (e.dtype, e.n, e.m, e.trials) == ("float32", 64, 1, 2)
            assert e.kernel_hash == spec.kernel_hash and e.us > 0
            found = runtime.explain(spec.name, (1, 64, "float32"))
            assert found.match == "exact", found
            assert found.config.to_json() == e.config
    finally:
        runtime.reset()
