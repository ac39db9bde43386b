"""RMSNorm forward under the Triton interpreter against its float64 reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_cases import draw_case

from kerneltune.kernels import REGISTRY
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


@pytest.mark.parametrize(("m", "n", "split"), [(2, 65536, 8), (1, 262144, 32), (300, 40000, 1)])
def test_long_rows_loop_and_split(m: int, n: int, split: int, device: str) -> None:
    """Long rows are looped over; few long rows are also split across programs."""
    problem = SPEC.problem(m, n, "bfloat16")
    config = SPEC.default(problem)
    assert config["SINGLE"] is False and config["SPLIT"] == split
    inputs = SPEC.make_inputs(problem, seed=1, device=device)
    assert SPEC.check(inputs, SPEC.run(inputs, config)) is None


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
    assert {c["SINGLE"] for c in configs} == {True, False}
    assert {c["SPLIT"] for c in configs} == {1}  # 3584 columns are too few to split


PROBLEMS = [(3, 100, "float32"), (5, 1000, "bfloat16"), (2, 5120, "float16"), (17, 64, "bfloat16"),
            (3, 20000, "bfloat16")]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_config_of_the_space_is_correct(data: st.DataObject) -> None:
    _, config, inputs = draw_case(data, SPEC, PROBLEMS, "offset", [0.0, 1.0])
    assert SPEC.check(inputs, SPEC.run(inputs, config)) is None, config
