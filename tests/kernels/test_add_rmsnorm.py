"""Fused residual add + RMSNorm forward under the Triton interpreter against its reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_cases import draw_case

from kerneltune.kernels import RowTilingConfig
from kerneltune.kernels._spec import as_rows
from kerneltune.kernels.add_rmsnorm import add_rmsnorm_fwd
from kerneltune.kernels.add_rmsnorm_spec import SPEC, add_rmsnorm_fwd_ref
from kerneltune.kernels.rmsnorm_fwd_spec import SPEC as RMSNORM_FWD
from kerneltune.kernels.rmsnorm_fwd_spec import rmsnorm_fwd_ref

DTYPES = ["float32", "float16", "bfloat16"]
NS = [1, 7, 64, 100, 3584, 4096, 5120]


def _inputs(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
            offset: float = 0.0) -> dict:
    return {"x": x, "residual": residual, "weight": weight, "eps": eps, "offset": offset}


def test_spec_identity() -> None:
    assert SPEC.name == "add_rmsnorm_fwd"
    assert SPEC.options == {"offset": (0.0, 1.0)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("m", [1, 13])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_default_config_matches_reference(dtype: str, n: int, m: int, offset: float,
                                          device: str) -> None:
    problem = SPEC.problem(m, n, dtype, offset=offset)
    inputs = SPEC.make_inputs(problem, seed=n + m, device=device)
    y, new_residual, rstd = SPEC.run(inputs, SPEC.default(problem))
    assert y.dtype == new_residual.dtype == problem.torch_dtype and rstd.dtype == torch.float32
    assert y.shape == new_residual.shape == (m, n) and rstd.shape == (m,)
    assert SPEC.check(inputs, (y, new_residual, rstd)) is None
    # The new residual is the fp32 sum rounded once: bit for bit.
    expected = (inputs["x"].float() + inputs["residual"].float()).to(problem.torch_dtype)
    assert torch.equal(new_residual, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("coop", [True, False])
def test_long_rows_split_over_programs_or_looped(dtype: str, offset: float, coop: bool,
                                                 device: str) -> None:
    """Few long rows are split over cooperating programs by default; looped, two passes."""
    problem = SPEC.problem(2, 40000, dtype, offset=offset)
    config = SPEC.default(problem)
    assert config.SINGLE is False and config.COOP is True
    if not coop:
        config = config.replace(COOP=False, BLOCK_N=16384)
    assert SPEC.valid(problem, config)
    inputs = SPEC.make_inputs(problem, seed=3, device=device)
    out = SPEC.run(inputs, config)
    assert SPEC.check(inputs, out) is None
    assert torch.equal(out[1], SPEC.reference(inputs)[1])


@pytest.mark.parametrize("evict", [True, False])
def test_looped_small_chunks_with_several_rows(evict: bool, device: str) -> None:
    """Many short chunks, several rows per program, and a ragged last chunk and row block: a
    tiling the tuner's space leaves out (it never pays), which the kernel still runs right."""
    problem = SPEC.problem(7, 1000, "bfloat16")
    config = RowTilingConfig(BLOCK_N=64, SINGLE=False, COOP=False, ROWS=4, EVICT=evict,
                             num_warps=2, num_stages=2)
    assert not SPEC.valid(problem, config)
    inputs = SPEC.make_inputs(problem, seed=11, device=device)
    assert SPEC.check(inputs, SPEC.run(inputs, config)) is None


def test_very_long_row(device: str) -> None:
    problem = SPEC.problem(1, 262144, "bfloat16")
    inputs = SPEC.make_inputs(problem, seed=5, device=device)
    assert SPEC.check(inputs, SPEC.run(inputs, SPEC.default(problem))) is None


def test_leading_dimensions_flattened(device: str) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 96, generator=g).to(device, torch.float16)
    res = torch.randn(2, 3, 5, 96, generator=g).to(device, torch.float16)
    w = torch.rand(96, generator=g).to(device, torch.float16) + 0.5
    config = SPEC.default(SPEC.problem(30, 96, "float16"))
    y, s, rstd = add_rmsnorm_fwd(as_rows(x), as_rows(res), w, 1e-5, 0.0, config)
    inputs = _inputs(as_rows(x), as_rows(res), w, 1e-5)
    assert SPEC.check(inputs, (y, s, rstd)) is None
    assert torch.equal(s.view(x.shape), (x.float() + res.float()).half())


@pytest.mark.parametrize("single", [True, False])
def test_strided_rows_and_empty(single: bool, device: str) -> None:
    g = torch.Generator().manual_seed(1)
    wide_x = torch.randn(9, 300, generator=g).to(device, torch.bfloat16)
    wide_r = torch.randn(9, 450, generator=g).to(device, torch.bfloat16)
    x, res = wide_x[:, 50:250], wide_r[:, 100:300]  # row strides 300 and 450
    w = torch.rand(200, generator=g).to(device, torch.bfloat16) + 0.5
    config = SPEC.default(SPEC.problem(9, 200, "bfloat16"))
    if not single:
        config = config.replace(SINGLE=False, BLOCK_N=64, num_stages=2)
    y, s, rstd = add_rmsnorm_fwd(x, res, w, 1e-6, 1.0, config)
    assert y.is_contiguous() and s.is_contiguous()
    assert SPEC.check(_inputs(x, res, w, 1e-6, 1.0), (y, s, rstd)) is None
    # The inputs are only read.
    assert torch.equal(wide_x, torch.randn(9, 300, generator=torch.Generator().manual_seed(1))
                       .to(device, torch.bfloat16))
    y0, s0, r0 = add_rmsnorm_fwd(x[:0], res[:0], w, 1e-6, 0.0, config)
    assert y0.shape == s0.shape == (0, 200) and r0.shape == (0,)


def test_equals_rmsnorm_of_the_sum(device: str) -> None:
    """y and rstd are the forward's on the new residual (the unfused two-kernel path)."""
    problem = SPEC.problem(5, 3584, "bfloat16")
    inputs = SPEC.make_inputs(problem, seed=2, device=device)
    y, s, rstd = SPEC.run(inputs, SPEC.default(problem))
    y_ref, r_ref = rmsnorm_fwd_ref(s, inputs["weight"], inputs["eps"])
    assert RMSNORM_FWD.check({"x": s, "weight": inputs["weight"], "eps": inputs["eps"],
                              "offset": 0.0}, (y, rstd), (y_ref, r_ref)) is None


def test_detects_wrong_output(device: str) -> None:
    problem = SPEC.problem(4, 256, "float16")
    inputs = SPEC.make_inputs(problem, 0, device)
    y, s, rstd = SPEC.run(inputs, SPEC.default(problem))
    bad = s.clone()
    bad[1, 3] = bad[1, 3] * 1.01 + 0.01
    assert "output 1" in SPEC.check(inputs, (y, bad, rstd))
    # A kernel that normalised x instead of x + residual.
    y_x, _, _ = add_rmsnorm_fwd_ref(inputs["x"], torch.zeros_like(inputs["x"]), inputs["weight"],
                                    inputs["eps"])
    assert "output 0" in SPEC.check(inputs, (y_x.to(y.dtype), s, rstd))


def test_bytes_moved() -> None:
    problem = SPEC.problem(16, 4096, "bfloat16")
    assert SPEC.bytes_moved(problem) == 4 * 16 * 4096 * 2 + 4096 * 2 + 4 * 16
    assert SPEC.make_inputs(problem, 0, "cpu").keys() == {"x", "residual", "weight", "eps",
                                                          "offset"}


@pytest.mark.parametrize("n", [1, 7, 100, 4096, 5120, 40000, 200_000, 262144])
@pytest.mark.parametrize("m", [1, 7, 13, 3000, 65536])
def test_default_is_valid(m: int, n: int) -> None:
    problem = SPEC.problem(m, n)
    config = SPEC.default(problem)
    assert SPEC.valid(problem, config)
    assert set(config) == set(SPEC.space(problem))
    assert all(config[k] in choices for k, choices in SPEC.space(problem).items())
    assert SPEC.rejects(problem, config) is None


PROBLEMS = [(3, 100, "float32"), (5, 1000, "bfloat16"), (2, 5120, "float16"), (17, 64, "bfloat16"),
            (1, 7, "float16"), (3, 20000, "bfloat16")]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_config_of_the_space_is_correct(data: st.DataObject) -> None:
    problem, config, inputs = draw_case(data, SPEC, PROBLEMS, "offset", [0.0, 1.0])
    out = SPEC.run(inputs, config)
    assert SPEC.check(inputs, out) is None, config
    assert torch.equal(out[1], SPEC.reference(inputs)[1]), config
    assert out[0].dtype == problem.torch_dtype
