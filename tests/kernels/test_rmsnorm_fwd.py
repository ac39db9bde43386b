"""RMSNorm forward under the Triton interpreter against its float64 reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_cases import draw_case
from offline import compiled_offline

from kerneltune.kernels import REGISTRY, ForwardConfig
from kerneltune.kernels.rmsnorm_fwd import rmsnorm_fwd
from kerneltune.kernels.rmsnorm_fwd_spec import SPEC, rmsnorm_fwd_ref

DTYPES = ["float32", "float16", "bfloat16"]
NS = [1, 7, 64, 100, 3584, 4096, 5120]


def test_registered() -> None:
    assert REGISTRY["rmsnorm_fwd"] is SPEC


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("m", [1, 13])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_default_config_matches_reference(dtype: str, n: int, m: int, offset: float,
                                          device: str) -> None:
    problem = SPEC.problem(m, n, dtype, offset=offset)
    inputs = SPEC.make_inputs(problem, seed=n + m, device=device)
    y, rstd = SPEC.run(inputs, SPEC.default(problem))
    assert y.dtype == problem.torch_dtype and rstd.dtype == torch.float32
    assert SPEC.check(inputs, (y, rstd)) is None


@pytest.mark.parametrize(("m", "n", "coop"), [(2, 65536, True), (1, 262144, True),
                                               (300, 40000, False)])
def test_long_rows_split_over_programs_or_looped(m: int, n: int, coop: bool, device: str) -> None:
    """Few long rows are split over cooperating programs by default, many are looped over."""
    problem = SPEC.problem(m, n, "bfloat16")
    config = SPEC.default(problem)
    assert config.SINGLE is False and config.COOP is coop
    inputs = SPEC.make_inputs(problem, seed=1, device=device)
    assert SPEC.check(inputs, SPEC.run(inputs, config)) is None


@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize(("rows", "block", "evict"), [(1, 1024, True), (4, 512, False)])
def test_split_rows_with_a_ragged_last_chunk_and_row_block(offset: float, rows: int, block: int,
                                                           evict: bool, device: str) -> None:
    problem = SPEC.problem(7, 2500, "float16", offset=offset)
    config = ForwardConfig(BLOCK_N=block, SINGLE=False, COOP=True, ROWS=rows, EVICT=evict,
                           num_warps=1, num_stages=1)
    assert SPEC.valid(problem, config)
    inputs = SPEC.make_inputs(problem, seed=rows, device=device)
    assert SPEC.check(inputs, SPEC.run(inputs, config)) is None


def test_configs_of_the_two_launch_split_it_replaced() -> None:
    """Stored before COOP: SPLIT = 1 was the row tiling, a split row has no reading."""
    problem = SPEC.problem(2, 65536)
    looped = {"BLOCK_N": 16384, "SINGLE": False, "ROWS": 1, "EVICT": True, "num_warps": 8,
              "num_stages": 2}
    assert SPEC.upgrade(problem, {**looped, "SPLIT": 1}) == {**looped, "COOP": False,
                                                              "GRID_MULT": 1,
                                                              "LATE_RELEASE": False}
    assert SPEC.parse(problem, {**looped, "SPLIT": 1}) == ForwardConfig(**looped)
    with pytest.raises(ValueError, match="SPLIT"):
        SPEC.upgrade(problem, {**looped, "BLOCK_N": 2048, "SPLIT": 8})
    with pytest.raises(ValueError, match="SPLIT"):
        SPEC.parse(problem, {**looped, "BLOCK_N": 2048, "SPLIT": 8})


def test_only_a_whole_row_chooses_when_it_releases_the_next_grid() -> None:
    problem = SPEC.problem(4096, 5120)
    configs = list(SPEC.configs(problem))
    late = [c for c in configs if c.LATE_RELEASE]
    assert late and all(c.SINGLE and not c.COOP for c in late)
    whole = [c for c in configs if c.SINGLE and not c.COOP]
    assert len(whole) == 2 * len(late)
    assert SPEC.default(problem).LATE_RELEASE is False
    # Configs stored before the choice released as they did: a whole row after its loads.
    stored = {"BLOCK_N": 8192, "SINGLE": True, "ROWS": 1, "EVICT": True, "num_warps": 8,
              "num_stages": 1, "GRID_MULT": 2}
    assert SPEC.upgrade(problem, stored)["LATE_RELEASE"] is False
    assert SPEC.parse(problem, stored) == ForwardConfig(**stored, LATE_RELEASE=False)


@pytest.mark.parametrize("n", [5120, 16384])
def test_the_one_row_launch_releases_as_it_exits_and_the_splits_stay(n: int) -> None:
    problem = SPEC.problem(4096, n)
    candidates = SPEC.candidates(problem)
    assert candidates[0].SINGLE and candidates[0].LATE_RELEASE is True
    assert all(SPEC.valid(problem, c) for c in candidates)
    assert any(c.COOP for c in candidates) is (n > 8192)  # splits of rows past one chunk


def test_a_looped_default_has_its_thin_loop_among_the_candidates() -> None:
    problem = SPEC.problem(2048, 32768)
    default = SPEC.default(problem)
    assert not default.SINGLE and not default.COOP and default.BLOCK_N == 16384
    loops = [c for c in SPEC.candidates(problem) if not c.SINGLE and not c.COOP]
    assert loops == [default.replace(BLOCK_N=8192, num_warps=32)]  # one 16-byte vector a thread
    assert SPEC.valid(problem, loops[0])
    # Tried before the splits, which a few more trials a key would spend first.
    candidates = SPEC.candidates(problem)
    first_split = next(i for i, c in enumerate(candidates) if c.COOP)
    assert candidates.index(loops[0]) < first_split
    # A default that splits the row is not a loop: none is added.
    split = SPEC.problem(16384, 65536)
    assert SPEC.default(split).COOP
    assert all(c.SINGLE or c.COOP for c in SPEC.candidates(split))


_RELEASE_REGISTERS = """
import sys
sys.path.insert(0, sys.argv[1])
from sass_mix import _kernel, hopper_registers
fn, sig, consts, _ = _kernel("rmsnorm_fwd", 8192)
for pdl, late in [(True, False), (True, True), (False, True)]:
    print(hopper_registers(fn, sig, {**consts, "PDL": pdl, "LATE_RELEASE": late}, 4))
"""


def test_the_late_release_takes_the_registers_of_no_dependent_launch_on_hopper() -> None:
    """A whole row of 8192 in 4 warps, compiled for sm_90 (offline) as a dependent launch:
    released after its loads, the row is held across the release in more registers a thread
    (119 against 95 with Triton 3.9: four programs an SM, not five); released as it exits, as
    many as without the dependent launch."""
    early, late, without = (int(v) for v in compiled_offline(_RELEASE_REGISTERS).split())
    assert late < early
    assert late == without


def test_strided_rows_and_empty(device: str) -> None:
    wide = torch.randn(9, 300, device=device, dtype=torch.float16)
    x = wide[:, 50:250]  # rows strided by 300
    w = torch.rand(200, device=device, dtype=torch.float16) + 0.5
    config = SPEC.default(SPEC.problem(9, 200, "float16"))
    y, rstd = rmsnorm_fwd(x, w, 1e-6, 0.0, config)
    ref_y, ref_r = rmsnorm_fwd_ref(x, w, 1e-6)
    assert SPEC.check({"x": x, "weight": w, "eps": 1e-6, "offset": 0.0}, (y, rstd),
                      (ref_y, ref_r)) is None
    empty, r0 = rmsnorm_fwd(x[:0], w, 1e-6, 0.0, config)
    assert empty.shape == (0, 200) and r0.shape == (0,)


def test_detects_wrong_output(device: str) -> None:
    """The checker the tuner relies on rejects a one-ulp-scale corruption and NaN."""
    problem = SPEC.problem(4, 256, "bfloat16")
    inputs = SPEC.make_inputs(problem, 0, device)
    y, rstd = SPEC.run(inputs, SPEC.default(problem))
    bad = y.clone()
    bad[2, 17] = bad[2, 17] * 1.05
    assert "off by more" in SPEC.check(inputs, (bad, rstd))
    bad[2, 17] = float("nan")
    assert "non-finite" in SPEC.check(inputs, (bad, rstd))


@pytest.mark.parametrize("n", [1, 100, 4096, 200_000])
@pytest.mark.parametrize("m", [1, 7, 3000, 65536])
def test_default_is_valid(m: int, n: int) -> None:
    problem = SPEC.problem(m, n)
    assert SPEC.valid(problem, SPEC.default(problem))


def test_every_enumerated_config_is_valid() -> None:
    problem = SPEC.problem(64, 3584)
    configs = list(SPEC.configs(problem))
    assert len(configs) > 50
    assert all(SPEC.valid(problem, c) for c in configs)
    assert {c.SINGLE for c in configs} == {True, False}
    assert {c.COOP for c in configs} == {True, False}


PROBLEMS = [(3, 100, "float32"), (5, 1000, "bfloat16"), (2, 5120, "float16"), (17, 64, "bfloat16"),
            (3, 20000, "bfloat16")]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_config_of_the_space_is_correct(data: st.DataObject) -> None:
    _, config, inputs = draw_case(data, SPEC, PROBLEMS, "offset", [0.0, 1.0])
    assert SPEC.check(inputs, SPEC.run(inputs, config)) is None, config

