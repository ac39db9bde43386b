"""Quantised RMSNorm forward (int8, fp8 e4m3, fake-quant) under the Triton interpreter."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_cases import draw_case

from kerneltune.kernels import REGISTRY, QuantConfig
from kerneltune.kernels._spec import as_rows, interpreting
from kerneltune.kernels.rmsnorm_fwd_spec import MAX_COOP, rmsnorm_fwd_ref
from kerneltune.kernels.rmsnorm_quant import (
    FP8_MAX,
    QUANT_MODES,
    _widen,
    quant_dtype,
    rmsnorm_quant_fwd,
    row_parts,
)
from kerneltune.kernels.rmsnorm_quant_spec import SPEC, rmsnorm_quant_fwd_ref

DTYPES = ["float32", "float16", "bfloat16"]
NS = [1, 7, 64, 100, 3584, 4096, 5120]
QTYPES = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}


def _default(m: int, n: int, dtype: str = "bfloat16", quant: str = "int8") -> QuantConfig:
    return SPEC.default(SPEC.problem(m, n, dtype, quant=quant))


def _inputs(x, weight, bias, eps, quant) -> dict:
    return {"x": x, "weight": weight, "bias": bias, "eps": eps, "quant": quant}


def test_spec_identity() -> None:
    assert SPEC.name == "rmsnorm_quant_fwd"
    assert tuple(SPEC.options["quant"]) == QUANT_MODES == ("int8", "fp8", "fake")


@pytest.mark.parametrize("quant", QUANT_MODES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("m", [1, 13])
def test_default_config_matches_reference(quant: str, dtype: str, n: int, m: int,
                                          device: str) -> None:
    problem = SPEC.problem(m, n, dtype, quant=quant)
    inputs = SPEC.make_inputs(problem, seed=n + m, device=device)
    q, scale = SPEC.run(inputs, SPEC.default(problem))
    assert q.dtype == QTYPES.get(quant, problem.torch_dtype) and q.shape == (m, n)
    assert scale.dtype == torch.float32 and scale.shape == (m,)
    assert SPEC.check(inputs, (q, scale)) is None


@pytest.mark.parametrize("quant", QUANT_MODES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("coop", [True, False])
def test_long_rows_split_over_programs_or_looped(quant: str, dtype: str, coop: bool,
                                                 device: str) -> None:
    """Few long rows are split over cooperating programs by default; looped, three passes."""
    problem = SPEC.problem(2, 40000, dtype, quant=quant)
    config = SPEC.default(problem)
    assert config.SINGLE is False and config.COOP is True
    if not coop:
        config = config.replace(COOP=False, BLOCK_N=16384)
    assert SPEC.valid(problem, config)
    inputs = SPEC.make_inputs(problem, seed=4, device=device)
    assert SPEC.check(inputs, SPEC.run(inputs, config)) is None


def test_row_parts_are_the_largest_block_and_the_rest_rounded_up() -> None:
    assert row_parts(5120) == (4096, 1024)
    assert row_parts(7168) == (4096, 4096)
    assert row_parts(2880) == (2048, 1024)
    assert row_parts(96) == (64, 32)
    assert row_parts(4096) == (4096, 0)
    assert row_parts(1) == (1, 0)


@pytest.mark.parametrize(("m", "n", "dtype"), [(5, 5120, "bfloat16"), (6, 96, "float16"),
                                               (3, 1536, "float32")])
@pytest.mark.parametrize("quant", QUANT_MODES)
def test_a_whole_row_in_two_blocks_matches_the_reference(m: int, n: int, dtype: str, quant: str,
                                                         device: str) -> None:
    """Every two-block config of the space with one or two programs an SM (more change only
    the interpreter's grid), several rows a program among them (row blocks past M included)."""
    problem = SPEC.problem(m, n, dtype, quant=quant)
    configs = [c for c in SPEC.configs(problem) if c.PARTS == 2 and c.GRID_MULT <= 2]
    assert configs and {c.BLOCK_N for c in configs} == {row_parts(n)[0]}
    assert any(m % c.ROWS for c in configs)
    assert {c.GRID_MULT for c in configs} == {1, 2}
    inputs = SPEC.make_inputs(problem, seed=n, device=device)
    for config in configs:
        assert SPEC.check(inputs, SPEC.run(inputs, config)) is None, config


def test_two_blocks_only_where_they_leave_fewer_lanes_idle() -> None:
    """A whole row of 5120 in 4096 + 1024 lanes instead of 8192; none for 7168 (4096 + 4096),
    a power of two, a looped row, or a tail with fewer elements than threads."""
    problem = SPEC.problem(4096, 5120, quant="int8")
    default = SPEC.default(problem)
    two = default.replace(PARTS=2, BLOCK_N=4096, num_warps=4)
    assert default.PARTS == 1 and default.BLOCK_N == 8192
    assert SPEC.valid(problem, two)
    assert two in SPEC.candidates(problem)
    assert not SPEC.valid(problem, two.replace(BLOCK_N=8192))
    assert not SPEC.valid(problem, two.replace(SINGLE=False, BLOCK_N=1024))
    short_tail = SPEC.problem(4096, 4096 + 256, quant="int8")  # 256 elements
    assert SPEC.valid(short_tail, two.replace(num_warps=8))
    assert not SPEC.valid(short_tail, two.replace(num_warps=16))
    for n in (7168, 4096):
        p = SPEC.problem(4096, n, quant="int8")
        assert not any(c.PARTS == 2 for c in SPEC.configs(p))
        assert all(c.PARTS == 1 for c in SPEC.candidates(p))
    # A whole row longer than one split chunk keeps its split candidates beside the two blocks.
    long_row = SPEC.problem(4096, 12288, quant="int8")
    kinds = {(c.COOP, c.PARTS, c.GRID_MULT > 1) for c in SPEC.candidates(long_row)}
    assert SPEC.default(long_row).SINGLE
    # The one-row launch, the two blocks; no persistent grid of 64 elements a thread.
    assert kinds == {(True, 1, True), (False, 1, False), (False, 2, False)}


def test_long_rows_try_24k_elements_an_sm_first_then_16k() -> None:
    """The staged split candidates of long rows, in order: six 4K programs of two warps an SM
    (the default's), twelve 2K of one and three 8K of four, 24K elements an SM; then four 4K of
    four and eight 2K of two, 16K. 2K chunks only up to MAX_COOP chunks a row."""
    first = [(4096, 2, 6), (2048, 1, 12), (8192, 4, 3), (4096, 4, 4), (2048, 2, 8)]
    for n in (32768, 65536, 131072):
        problem = SPEC.problem(4096, n, quant="int8")
        staged = [c for c in SPEC.candidates(problem) if c.COOP and c.num_stages == 3]
        assert [(c.BLOCK_N, c.num_warps, c.GRID_MULT) for c in staged[:5]] == first
        assert all(c.ROWS == 1 and SPEC.valid(problem, c) for c in staged)
    too_many = SPEC.problem(4096, 2048 * (MAX_COOP + 1), quant="int8")
    assert not any(c.BLOCK_N == 2048 for c in SPEC.candidates(too_many) if c.COOP)


def test_rows_past_one_register_block_try_the_whole_row_in_two() -> None:
    """Past 16384 elements the default splits the row; the first candidate holds it whole in
    one program of 16 warps with q in x's layout, up to the 32768 that two register blocks
    take."""
    for n in (20000, 32768):
        problem = SPEC.problem(4096, n, quant="int8")
        whole = [c for c in SPEC.candidates(problem) if c.SINGLE]
        assert not SPEC.default(problem).SINGLE
        assert whole == SPEC.one_row_launch(problem) == SPEC.candidates(problem)[:1]
        assert whole[0].X_LAYOUT and not whole[0].COOP
        # Every parameter set: the kernel's config type, as the default's.
        assert type(whole[0]) is type(SPEC.default(problem)) is QuantConfig
        assert whole[0].keys() == SPEC.default(problem).keys()
        assert whole[0].BLOCK_N == 32768 and whole[0].num_warps == 16
        assert SPEC.valid(problem, whole[0])
    assert not any(c.SINGLE for c in SPEC.candidates(SPEC.problem(4096, 40000, quant="int8")))


@pytest.mark.parametrize("quant", QUANT_MODES)
def test_the_whole_row_in_two_register_blocks_runs(quant: str, device: str) -> None:
    problem = SPEC.problem(3, 20000, quant=quant)
    inputs = SPEC.make_inputs(problem, seed=5, device=device)
    [whole] = SPEC.one_row_launch(problem)
    assert SPEC.check(inputs, SPEC.run(inputs, whole)) is None


def test_whole_rows_on_a_persistent_grid() -> None:
    """The default's whole row, in one block and in two, on 2-4 programs per SM, at its warps
    and half; at few rows also one row a program; never for a split, or 64 elements a thread
    under a register cap."""
    problem = SPEC.problem(4096, 5120, quant="int8")
    default = SPEC.default(problem)
    for parts in ({}, {"PARTS": 2, "BLOCK_N": 4096}):
        persistent = [c for c in SPEC.candidates(problem)
                      if c.GRID_MULT > 1 and parts.get("PARTS", 1) == c.PARTS]
        assert {(c.GRID_MULT, c.num_warps) for c in persistent} == {
            (3, 8), (4, 8), (2, 8), (2, 4)}
        assert all(c == default.replace(EVICT=True, GRID_MULT=c.GRID_MULT,
                                        num_warps=c.num_warps, **parts) for c in persistent)
    # 8192 at 4 warps is 64 elements a thread: only at two programs per SM, uncapped; two
    # blocks are bounded as the one.
    for parts in ({}, {"PARTS": 2, "BLOCK_N": 4096}):
        assert not SPEC.valid(problem, default.replace(GRID_MULT=3, num_warps=4, **parts))
        assert SPEC.valid(problem, default.replace(GRID_MULT=2, num_warps=4, **parts))
    assert not SPEC.valid(problem, default.replace(GRID_MULT=4, num_warps=16))  # 64 warps
    few = SPEC.problem(16, 1024, quant="int8")
    assert SPEC.default(few).ROWS == 2
    assert SPEC.default(few).replace(GRID_MULT=2, ROWS=1) in SPEC.candidates(few)


@pytest.mark.parametrize("m", [1, 2, 64, 4096])
def test_every_candidate_is_a_valid_config(m: int) -> None:
    """Down to rows of a few elements, whose default has one warp (half of it is none)."""
    for n in [*range(1, 130), 2880, 5120, 6144, 40000]:
        problem = SPEC.problem(m, n, quant="int8")
        for config in SPEC.candidates(problem):
            assert SPEC.valid(problem, config), (n, config)


def test_configs_stored_before_parts_hold_the_row_in_one_block() -> None:
    problem = SPEC.problem(4096, 5120, quant="int8")
    stored = {k: v for k, v in SPEC.default(problem).to_json().items() if k != "PARTS"}
    assert SPEC.upgrade(problem, stored)["PARTS"] == 1
    assert SPEC.parse(problem, stored).PARTS == 1


def test_configs_stored_before_x_layout_store_q_in_its_own() -> None:
    problem = SPEC.problem(4096, 5120, quant="int8")
    stored = {k: v for k, v in SPEC.default(problem).to_json().items() if k != "X_LAYOUT"}
    assert SPEC.upgrade(problem, stored)["X_LAYOUT"] is False
    assert SPEC.parse(problem, stored).X_LAYOUT is False


def test_q_in_x_layout_is_searched_wherever_one_program_holds_whole_rows() -> None:
    """Whole rows (one block, two, or on a persistent grid) and looped rows may store q in x's
    layout; the split may not."""
    for n, m in [(5120, 4096), (7168, 4096), (65536, 16), (40000, 4096)]:
        problem = SPEC.problem(m, n, quant="int8")
        configs = list(SPEC.configs(problem))
        assert {c.X_LAYOUT for c in configs if not c.COOP} == {False, True}, n
        assert not any(c.X_LAYOUT for c in configs if c.COOP), n
        assert all(c.replace(X_LAYOUT=True) in configs for c in configs if not c.COOP), n


@pytest.mark.parametrize("quant", QUANT_MODES)
def test_q_in_x_layout_stores_what_its_own_layout_does(quant: str, device: str) -> None:
    """One block, two blocks, a persistent grid of either and the looped kernel, each in both
    layouts: both right, and under the interpreter (which has no layouts) the same values."""
    problem = SPEC.problem(6, 5120, "bfloat16", quant=quant)
    default = SPEC.default(problem)
    kinds = [default, default.replace(PARTS=2, BLOCK_N=4096),
             default.replace(GRID_MULT=2, ROWS=1),
             default.replace(PARTS=2, BLOCK_N=4096, GRID_MULT=2, ROWS=1),
             default.replace(SINGLE=False, BLOCK_N=1024, ROWS=1, num_warps=4)]
    inputs = SPEC.make_inputs(problem, seed=21, device=device)
    for config in kinds:
        assert SPEC.valid(problem, config.replace(X_LAYOUT=True)), config
        own = SPEC.run(inputs, config)
        x_layout = SPEC.run(inputs, config.replace(X_LAYOUT=True))
        assert SPEC.check(inputs, x_layout) is None, config
        if device == "cpu":
            for a, b in zip(own, x_layout, strict=True):
                assert torch.equal(a.view(torch.uint8) if a.dtype != torch.float32 else a,
                                   b.view(torch.uint8) if b.dtype != torch.float32 else b)


@pytest.mark.parametrize("quant", QUANT_MODES)
def test_looped_small_chunks_with_several_rows(quant: str, device: str) -> None:
    """A tiling outside the tuner's space (it never pays), which the kernel still runs right."""
    problem = SPEC.problem(7, 1000, "float16", quant=quant)
    config = QuantConfig(BLOCK_N=128, SINGLE=False, COOP=False, ROWS=4, EVICT=False,
                         num_warps=4, num_stages=3)
    assert not SPEC.valid(problem, config)
    inputs = SPEC.make_inputs(problem, seed=12, device=device)
    assert SPEC.check(inputs, SPEC.run(inputs, config)) is None


def test_int8_dequantises_to_the_normalised_rows(device: str) -> None:
    """q · s is y to within half a step; each row's largest |y| maps to ±127."""
    problem = SPEC.problem(13, 4096, "bfloat16", quant="int8")
    inputs = SPEC.make_inputs(problem, seed=7, device=device)
    q, s = SPEC.run(inputs, SPEC.default(problem))
    y, _ = rmsnorm_fwd_ref(inputs["x"], inputs["weight"], inputs["eps"])
    y = y.to(torch.bfloat16).double().cpu()
    q64, s64 = q.double().cpu(), s.double().cpu()[:, None]
    assert ((q64 * s64 - y).abs() <= 0.5 * s64 * (1 + 1e-5)).all()
    assert torch.equal(q64.abs().amax(1), torch.full((13,), 127.0, dtype=torch.float64))
    assert torch.allclose(s64.squeeze(1), y.abs().amax(1) / 127, rtol=1e-6)


def test_fp8_uses_the_whole_range(device: str) -> None:
    problem = SPEC.problem(5, 3584, "float16", quant="fp8")
    inputs = SPEC.make_inputs(problem, seed=8, device=device)
    q, s = SPEC.run(inputs, SPEC.default(problem))
    qf = q.float().cpu()
    assert torch.equal(qf.abs().amax(1), torch.full((5,), FP8_MAX))
    y, _ = rmsnorm_fwd_ref(inputs["x"], inputs["weight"], inputs["eps"])
    # e4m3 keeps 3 mantissa bits: relative error at most 2^-4 above the subnormals.
    deq = qf.double() * s.double().cpu()[:, None]
    y = y.to(torch.float16).double().cpu()
    assert ((deq - y).abs() <= 2.0**-4 * y.abs() + 2.0**-9 * s.double().cpu()[:, None]).all()


@pytest.mark.parametrize("gain", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_fake_quant_optional_gain_and_bias(gain: bool, bias: bool, device: str) -> None:
    problem = SPEC.problem(6, 700, "bfloat16", quant="fake")
    inputs = SPEC.make_inputs(problem, seed=9, device=device)
    inputs["weight"] = inputs["weight"] if gain else None
    inputs["bias"] = inputs["bias"] if bias else None
    out, scale = SPEC.run(inputs, SPEC.default(problem))
    assert SPEC.check(inputs, (out, scale)) is None
    # out is the normalised row to within half a quantisation step.
    z = inputs["x"].double() * torch.rsqrt(inputs["x"].double().pow(2).mean(-1, keepdim=True)
                                           + inputs["eps"])
    if gain:
        z = z * inputs["weight"].double()
    if bias:
        z = z + inputs["bias"].double()
    step = 1.0 / scale.double()[:, None]
    assert ((out.double() - z).abs() <= 0.5 * step + 2.0**-8 * z.abs() + 1e-6).all()


def test_fake_quant_differs_with_and_without_bias(device: str) -> None:
    problem = SPEC.problem(3, 256, "float32", quant="fake")
    inputs = SPEC.make_inputs(problem, seed=10, device=device)
    with_bias, _ = SPEC.run(inputs, SPEC.default(problem))
    without, _ = SPEC.run({**inputs, "bias": None}, SPEC.default(problem))
    assert not torch.equal(with_bias, without)
    assert SPEC.check({**inputs, "bias": None}, SPEC.run({**inputs, "bias": None},
                                                         SPEC.default(problem))) is None


def _tie_row(device: str) -> torch.Tensor:
    """A row whose rstd is exactly 1/2 and whose y / s falls on ties: 15.5, ±2.5, 1.5."""
    x = torch.zeros(16, dtype=torch.float32)
    x[:5] = torch.tensor([127 / 16, 31 / 32, 5 / 32, -5 / 32, 3 / 32])
    assert x.pow(2).sum().item() == 64.0  # mean 4: r = 1/2, max|y| = 127/32, s = 1/32
    return x[None, :].to(device)


@pytest.mark.parametrize("quant", ["int8", "fake"])
def test_rounds_half_to_even(quant: str, device: str) -> None:
    x = _tie_row(device)
    weight = torch.ones(16, device=device)
    q, scale = rmsnorm_quant_fwd(x, weight if quant == "int8" else None, None, 0.0, quant,
                                 _default(1, 16, "float32", quant))
    values = q[0, :5].double().cpu() * (1.0 if quant == "int8" else 32.0)
    assert values.tolist() == [127.0, 16.0, 2.0, -2.0, 2.0]
    assert not q[0, 5:].any()
    assert scale.item() == (1 / 32 if quant == "int8" else 32.0)


def test_leading_dimensions_and_strided_rows(device: str) -> None:
    g = torch.Generator().manual_seed(3)
    x4 = torch.randn(2, 3, 4, 80, generator=g).to(device, torch.float16)
    w = (torch.rand(80, generator=g) + 0.5).to(device, torch.float16)
    for quant in QUANT_MODES:
        bias = None if quant != "fake" else torch.randn(80, generator=g).to(device, torch.float16)
        rows = as_rows(x4)
        out = rmsnorm_quant_fwd(rows, w, bias, 1e-6, quant, _default(24, 80, "float16", quant))
        assert SPEC.check(_inputs(rows, w, bias, 1e-6, quant), out) is None
    wide = torch.randn(9, 500, generator=g).to(device, torch.bfloat16)
    x = wide[:, 100:400]  # rows strided by 500
    w = (torch.rand(300, generator=g) + 0.5).to(device, torch.bfloat16)
    for single in (True, False):
        config = _default(9, 300)
        if not single:
            config = config.replace(SINGLE=False, BLOCK_N=64, num_stages=2)
        out = rmsnorm_quant_fwd(x, w, None, 1e-6, "int8", config)
        assert SPEC.check(_inputs(x, w, None, 1e-6, "int8"), out) is None
        assert torch.equal(out[0].cpu(), rmsnorm_quant_fwd_ref(x, w, None, 1e-6, "int8")[0].cpu())


@pytest.mark.parametrize("quant", QUANT_MODES)
def test_empty(quant: str, device: str) -> None:
    x = torch.randn(0, 64, device=device, dtype=torch.bfloat16)
    w = torch.ones(64, device=device, dtype=torch.bfloat16)
    q, s = rmsnorm_quant_fwd(x, w, None, 1e-6, quant, _default(1, 64))
    assert q.shape == (0, 64) and s.shape == (0,) and q.dtype == quant_dtype(quant, x.dtype)


def test_bad_arguments(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(2, 64, device=device)
    w = torch.ones(64, device=device)
    config = _default(2, 64)
    with pytest.raises(ValueError, match="quant must be one of"):
        rmsnorm_quant_fwd(x, w, None, 1e-6, "int4", config)
    with pytest.raises(ValueError, match="bias is only supported"):
        rmsnorm_quant_fwd(x, w, w, 1e-6, "int8", config)
    with pytest.raises(ValueError, match="needs the RMSNorm weight"):
        rmsnorm_quant_fwd(x, None, None, 1e-6, "fp8", config)
    monkeypatch.delattr(torch, "float8_e4m3fn")
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        rmsnorm_quant_fwd(x, w, None, 1e-6, "fp8", config)


@pytest.mark.parametrize("quant", QUANT_MODES)
def test_detects_wrong_output(quant: str, device: str) -> None:
    problem = SPEC.problem(4, 256, "bfloat16", quant=quant)
    inputs = SPEC.make_inputs(problem, 0, device)
    q, s = SPEC.run(inputs, SPEC.default(problem))
    assert SPEC.check(inputs, (q, s)) is None
    bad = q.clone()
    if quant == "int8":
        bad[1, 5] += 1 if bad[1, 5] < 127 else -1
    elif quant == "fp8":  # two e4m3 steps
        bad[1, 5] = (bad[1, 5].float() * 1.25 + 0.05).to(q.dtype)
    else:  # one quantisation step
        bad[1, 5] = (bad[1, 5].float() + 1.0 / s[1]).to(q.dtype)
    assert SPEC.check(inputs, (bad, s)) is not None
    bad_scale = s.clone()
    bad_scale[2] *= 1.001
    assert "scale of row 2" in SPEC.check(inputs, (q, bad_scale))
    assert "expected" in SPEC.check(inputs, (q.float(), s))


@pytest.mark.parametrize("quant", QUANT_MODES)
def test_large_problems_are_checked_a_few_rows_at_a_time(quant: str, device: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Bounded memory (the whole check of 65536 x 14336 at once needs more than 80 GB), and
    the same verdicts, with rows numbered in the whole problem."""
    from kerneltune.kernels import _spec

    monkeypatch.setattr(_spec, "CHECK_ELEMS", 3 * 256)  # three rows a chunk
    problem = SPEC.problem(8, 256, "bfloat16", quant=quant)
    inputs = SPEC.make_inputs(problem, 0, device)
    q, s = SPEC.run(inputs, SPEC.default(problem))
    assert SPEC.check(inputs, (q, s)) is None
    bad = q.clone()
    v = bad[7, 5].float()  # in the third chunk
    # e4m3 has no infinity: past 448 a value becomes NaN, not a wrong q
    fp8_wrong = v * 0.5 if v.abs() >= 1 else v + 16.0
    bad[7, 5] = (fp8_wrong if quant == "fp8" else v * 1.25 + 4.0 / s[7]).to(q.dtype)
    why = SPEC.check(inputs, (bad, s))
    # fake's out is first found off the q / scale grid, which names the chunk, not the value
    assert ("rows from 6" if quant == "fake" else "first at (7, 5)") in why
    bad_scale = s.clone()
    bad_scale[4] *= 1.001
    assert "scale of row 4" in SPEC.check(inputs, (q, bad_scale))


def test_bytes_moved() -> None:
    m, n = 16, 4096
    assert SPEC.bytes_moved(SPEC.problem(m, n, "bfloat16", quant="int8")) == (
        m * n * 2 + m * n + 4 * m + n * 2)
    assert SPEC.bytes_moved(SPEC.problem(m, n, "float32", quant="fp8")) == (
        m * n * 4 + m * n + 4 * m + n * 4)
    assert SPEC.bytes_moved(SPEC.problem(m, n, "float16", quant="fake")) == (
        2 * m * n * 2 + 4 * m + 2 * n * 2)
    inputs = SPEC.make_inputs(SPEC.problem(2, 8, quant="fake"), 0, "cpu")
    assert inputs.keys() == {"x", "weight", "bias", "eps", "quant"}
    assert inputs["bias"] is not None and inputs["eps"] == 1e-5


@pytest.mark.parametrize("n", [1, 7, 100, 4096, 5120, 40000, 200_000, 262144])
@pytest.mark.parametrize("m", [1, 7, 13, 3000, 65536])
def test_default_is_valid(m: int, n: int) -> None:
    for quant in QUANT_MODES:
        problem = SPEC.problem(m, n, quant=quant)
        config = SPEC.default(problem)
        assert SPEC.valid(problem, config)
        assert all(config[k] in choices for k, choices in SPEC.space(problem).items())
        assert SPEC.rejects(problem, config) is None


PROBLEMS = [(3, 100, "float32"), (5, 1000, "bfloat16"), (2, 5120, "float16"), (17, 64, "bfloat16"),
            (1, 7, "float16"), (6, 96, "bfloat16")]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_config_of_the_space_is_correct(data: st.DataObject) -> None:
    _, config, inputs = draw_case(data, SPEC, PROBLEMS, "quant", QUANT_MODES)
    assert SPEC.check(inputs, SPEC.run(inputs, config)) is None, config


@triton.jit
def _widened(X, Y, N, SOFT_ROUND: tl.constexpr):
    c = tl.program_id(0) * 1024 + tl.arange(0, 1024)
    tl.store(Y + c, _widen(tl.load(X + c, mask=c < N), SOFT_ROUND), mask=c < N)


def test_widen_is_exact_for_every_bf16(device: str) -> None:
    """Every bf16 bit pattern, NaNs and infinities included, widens to the fp32 whose high half
    it is: on a GPU through the split's PTX, under the interpreter through `.to`, which flushes
    the 254 subnormals to zero there (so they are left out)."""
    bits = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32)
    if interpreting():
        subnormal = ((bits >> 7) & 0xFF == 0) & (bits & 0x7F != 0)
        bits = bits[~subnormal]
    x = bits.to(torch.int16).view(torch.bfloat16).to(device)
    y = torch.empty(x.shape, dtype=torch.float32, device=device)
    _widened[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), SOFT_ROUND=interpreting())
    assert torch.equal(y.cpu().view(torch.int32), bits << 16)


def test_a_key_serves_int8_and_fp8() -> None:
    """A tuning key's problem has no mode, so its entry answers both quantising modes, which
    its search times; a problem of one mode serves itself, and other kernels their problem."""
    problem = SPEC.problem(4096, 5120, "bfloat16")
    assert [p.option("quant", None) for p in SPEC.served(problem)] == ["int8", "fp8"]
    assert {(p.m, p.n, p.dtype) for p in SPEC.served(problem)} == {(4096, 5120, "bfloat16")}
    fp8 = SPEC.problem(4096, 5120, "bfloat16", quant="fp8")
    assert SPEC.served(fp8) == [fp8]
    forward = REGISTRY["rmsnorm_fwd"]
    assert forward.served(forward.problem(4096, 5120)) == [forward.problem(4096, 5120)]
