"""LayerNorm forward and backward under the Triton interpreter against their float64 references
and float64 autograd through torch's own layer norm."""

from __future__ import annotations

from importlib.metadata import entry_points
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from offline import compiled_offline

from kerneltune.kernels import (
    REGISTRY,
    BackwardConfig,
    KernelConfig,
    KernelSpec,
    RowTilingConfig,
    _coop,
    layernorm,
    rmsnorm_bwd,
)
from kerneltune.kernels import layernorm_bwd as backward_code
from kerneltune.kernels._coop_dependent import fill_unset
from kerneltune.kernels._spec import TORCH_DTYPES, jit_functions, sm_count
from kerneltune.kernels.layernorm import describe_layernorm_fwd, layernorm_fwd
from kerneltune.kernels.layernorm_bwd import (
    _chunk_partials,
    _layernorm_bwd_split_kernel,
    describe_layernorm_bwd,
    layernorm_bwd,
)
from kerneltune.kernels.layernorm_spec import (
    BWD,
    EPS,
    FWD,
    layernorm_bwd_ref,
    layernorm_fwd_ref,
)
from kerneltune.kernels.rmsnorm_bwd import NEXT_TO_UNSET, _dw_reduce_kernel, grid_size
from kerneltune.kernels.rmsnorm_bwd_spec import MAX_SPLIT

DTYPES = ["float32", "float16", "bfloat16"]
NS = [1, 7, 100, 3000]


def autograd_grads(inputs: dict, weight: bool = True, bias: bool = True
                   ) -> tuple[torch.Tensor | None, ...]:
    """dx, dw and db by float64 autograd through torch's layer norm (None where absent)."""
    x = inputs["x"].double().requires_grad_()
    w = inputs["weight"].double().requires_grad_() if weight else None
    b = inputs["bias"].double().requires_grad_() if bias else None
    F.layer_norm(x, x.shape[-1:], w, b, EPS).backward(inputs["dy"].double())
    return x.grad, None if w is None else w.grad, None if b is None else b.grad


def test_registered_through_its_entry_point() -> None:
    (entry,) = [e for e in entry_points(group="kerneltune.kernels") if e.name == "layernorm"]
    assert entry.value == "kerneltune.kernels.layernorm_spec:SPECS"
    assert entry.load() == [FWD, BWD]
    assert REGISTRY["layernorm_fwd"] is FWD and REGISTRY["layernorm_bwd"] is BWD


def test_each_direction_is_hashed_without_the_other() -> None:
    """The forward's and the backward's kernels live in modules of their own, sharing only
    their loads and the dependent launch's wait and release, so an edit to one direction
    leaves the other's tuned entries current; the backward's hash covers its whole rows',
    looped and split kernels and the reduction."""
    assert FWD.module is layernorm and BWD.module is backward_code

    def hashed(module: ModuleType) -> set[str]:
        return {fn.fn.__name__ for m in (module, *module.DEVICE_CODE_FROM)
                for fn in jit_functions(m)}

    forward, backward = hashed(layernorm), hashed(backward_code)
    assert forward & backward == {"load_f32", "column_vector", "wait_prior_grid",
                                  "release_next_grid"}
    assert "_layernorm_fwd_kernel" in forward and "_layernorm_fwd_kernel" not in backward
    assert {"_layernorm_bwd_kernel", "_layernorm_bwd_split_kernel",
            "_dw_reduce_kernel"} <= backward
    assert {rmsnorm_bwd, _coop} <= set(backward_code.DEVICE_CODE_FROM)
    assert BWD.kernel_hash != FWD.kernel_hash


# ------------------------------------------------------------------------------ forward


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("m", [1, 13])
def test_forward_default_matches_reference_and_torch(dtype: str, n: int, m: int,
                                                     device: str) -> None:
    problem = FWD.problem(m, n, dtype)
    inputs = FWD.make_inputs(problem, seed=n + m, device=device)
    y, mean, rstd = FWD.run(inputs, FWD.default(problem))
    assert y.dtype == problem.torch_dtype and mean.dtype == rstd.dtype == torch.float32
    assert FWD.check(inputs, (y, mean, rstd)) is None
    x, w, b = (inputs[k].double() for k in ("x", "weight", "bias"))
    expected = F.layer_norm(x, (n,), w, b, EPS)
    assert FWD.check(inputs, (y, mean, rstd), (expected, x.mean(-1), rstd.double())) is None


@pytest.mark.parametrize(("m", "n"), [(2, 20000), (3, 1100)])
def test_forward_loops_over_long_rows(m: int, n: int, device: str) -> None:
    problem = FWD.problem(m, n, "bfloat16")
    inputs = FWD.make_inputs(problem, seed=m, device=device)
    default = FWD.default(problem)
    assert default.SINGLE is (n <= 16384)
    looped = default.replace(BLOCK_N=512, SINGLE=False, ROWS=1, num_warps=2, num_stages=2)
    for config in (default, looped):
        assert FWD.valid(problem, config)
        assert FWD.check(inputs, FWD.run(inputs, config)) is None, config


def test_looped_statistics_hold_far_from_zero(device: str) -> None:
    """The loop merges each chunk's centred statistics: rows 10⁴ standard deviations from zero
    (where Σx² / N − mean² in fp32 would lose every digit of the variance), rising along the
    row (so that the chunks' means differ), come out within the fp32 bounds of the float64
    reference."""
    problem = FWD.problem(3, 3000, "float32")
    inputs = FWD.make_inputs(problem, seed=5, device=device)
    ramp = torch.linspace(0, 8, 3000, device=device)
    inputs["x"] = inputs["x"] / 2 + 1e4 + ramp
    looped = RowTilingConfig(BLOCK_N=512, SINGLE=False, ROWS=1, EVICT=True, num_warps=2,
                             num_stages=1)
    assert FWD.valid(problem, looped)
    y, mean, rstd = FWD.run(inputs, looped)
    assert FWD.check(inputs, (y, mean, rstd)) is None
    expected = inputs["x"].double().var(-1, unbiased=False)
    torch.testing.assert_close(1 / rstd.double() ** 2 - EPS, expected, rtol=1e-3, atol=0)


@pytest.mark.parametrize(("weight", "bias"), [(False, False), (True, False), (False, True)])
def test_forward_without_weight_or_bias(weight: bool, bias: bool, device: str) -> None:
    problem = FWD.problem(5, 300, "float16")
    inputs = FWD.make_inputs(problem, seed=2, device=device)
    inputs["weight"] = inputs["weight"] if weight else None
    inputs["bias"] = inputs["bias"] if bias else None
    for config in (FWD.default(problem), RowTilingConfig(
            BLOCK_N=64, SINGLE=False, ROWS=1, EVICT=False, num_warps=1, num_stages=1)):
        out = layernorm_fwd(inputs["x"], inputs["weight"], inputs["bias"], EPS, config)
        assert FWD.check(inputs, out) is None
        x = inputs["x"].double()
        torch_y = F.layer_norm(x, (300,), *(None if t is None else t.double()
                                            for t in (inputs["weight"], inputs["bias"])), EPS)
        assert FWD.check(inputs, out, (torch_y, *layernorm_fwd_ref(x, None, None, EPS)[1:])
                         ) is None


def test_forward_persistent_grid_takes_every_pth_row_block(device: str) -> None:
    m = 15 * sm_count(device) + 1
    problem = FWD.problem(m, 200, "bfloat16")
    config = FWD.default(problem).replace(GRID_MULT=2, ROWS=2, num_warps=1)
    assert FWD.valid(problem, config)
    (launch,) = describe_layernorm_fwd(torch.empty(m, 200, device=device), None, None, EPS,
                                       config).launches
    assert launch.grid == (2 * sm_count(device),) < (m // 2,)
    inputs = FWD.make_inputs(problem, seed=3, device=device)
    assert FWD.check(inputs, FWD.run(inputs, config)) is None


def test_forward_strided_rows_and_empty(device: str) -> None:
    wide = torch.randn(9, 300, device=device, dtype=torch.bfloat16) + 1
    x = wide[:, 50:250]
    assert x.stride(0) == 300
    w, b = torch.rand(200, device=device) + 0.5, torch.randn(200, device=device)
    config = FWD.default(FWD.problem(9, 200, "bfloat16"))
    inputs = {"x": x, "weight": w, "bias": b, "eps": EPS}
    assert FWD.check(inputs, layernorm_fwd(x, w, b, EPS, config)) is None
    y, mean, rstd = layernorm_fwd(x[:0], w, b, EPS, config)
    assert y.shape == (0, 200) and mean.shape == rstd.shape == (0,)


def test_forward_check_detects_wrong_output(device: str) -> None:
    """The check the tuner relies on rejects a corrupted y, a mean that lost an element, NaN."""
    problem = FWD.problem(4, 1000, "float32")
    inputs = FWD.make_inputs(problem, 0, device)
    y, mean, rstd = FWD.run(inputs, FWD.default(problem))
    bad = y.clone()
    bad[2, 17] = bad[2, 17] * 1.001
    assert FWD.check(inputs, (bad, mean, rstd)).startswith("y, rows 0-3: 1/4000 values off")
    lost = mean.clone()
    lost[1] -= inputs["x"][1, 5].float() / 1000
    assert FWD.check(inputs, (y, lost, rstd)).startswith("mean")
    bad[2, 17] = float("nan")
    assert "non-finite" in FWD.check(inputs, (bad, mean, rstd))
    assert "dtype" in FWD.check(inputs, (y.half(), mean, rstd))


def test_forward_refuses_a_row_split_and_what_it_cannot_run() -> None:
    x = torch.empty(4, 64, device="meta")
    default = FWD.default(FWD.problem(4, 64, "float32"))
    with pytest.raises(ValueError, match=r"cannot launch.*COOP"):
        describe_layernorm_fwd(x, None, None, EPS, default.replace(COOP=True))
    with pytest.raises(ValueError, match=r"cannot launch.*BLOCK_N=16 < 64"):
        describe_layernorm_fwd(x, None, None, EPS, default.replace(BLOCK_N=16))
    assert not FWD.valid(FWD.problem(4, 64), default.replace(COOP=True))
    assert FWD.space(FWD.problem(4, 64))["COOP"] == [False]


@pytest.mark.parametrize("n", [1, 100, 4096, 16384, 40000, 262144])
@pytest.mark.parametrize("m", [1, 7, 65536])
def test_defaults_are_valid(m: int, n: int) -> None:
    for spec in (FWD, BWD):
        problem = spec.problem(m, n)
        assert spec.rejects(problem, spec.default(problem)) is None


def test_every_enumerated_config_is_valid() -> None:
    for spec in (FWD, BWD):
        problem = spec.problem(64, 3584)
        configs = list(spec.configs(problem))
        assert len(configs) > 50
        assert all(spec.rejects(problem, c) is None for c in configs)
        assert {c.SINGLE for c in configs} == {True, False}
        assert {c.GRID_MULT for c in configs} > {1}


def test_bytes_moved() -> None:
    m, n = 4096, 5120
    assert FWD.bytes_moved(FWD.problem(m, n)) == 2 * m * n * 2 + 2 * n * 2 + 8 * m
    assert BWD.bytes_moved(BWD.problem(m, n)) == 3 * m * n * 2 + 3 * n * 2 + 8 * m


PROBLEMS = [(3, 100, "float32"), (5, 1000, "bfloat16"), (17, 64, "float16"), (2, 1500, "float32")]


def draw_case(data: st.DataObject, spec: KernelSpec) -> tuple[KernelConfig, dict]:
    """A config of the space of one of `PROBLEMS` (the kernels have no options) and inputs."""
    problem = spec.problem(*data.draw(st.sampled_from(PROBLEMS)))
    config = data.draw(st.sampled_from(list(spec.configs(problem))))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return config, spec.make_inputs(problem, data.draw(st.integers(0, 2**16)), device)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_forward_config_of_the_space_is_correct(data: st.DataObject) -> None:
    config, inputs = draw_case(data, FWD)
    assert FWD.check(inputs, FWD.run(inputs, config)) is None, config


# ------------------------------------------------------------------------ compiled for sm_90

_COMPILED = """
import sys
sys.path.insert(0, sys.argv[1])
from sass_mix import hopper_registers
from kerneltune.kernels.layernorm import _layernorm_fwd_kernel
from kerneltune.kernels.layernorm_bwd import _layernorm_bwd_kernel
fwd = {"X": "*bf16", "W": "*bf16", "B": "*bf16", "Y": "*bf16", "MEAN": "*fp32", "RSTD": "*fp32",
       "stride_x": "i32", "stride_y": "i32", "M": "i32", "N": "i32", "eps": "fp32"}
bwd = {"DY": "*bf16", "X": "*bf16", "W": "*bf16", "MEAN": "*fp32", "RSTD": "*fp32",
       "DX": "*bf16", "DW_PART": "*fp32", "DB_PART": "*fp32", "stride_dy": "i32",
       "stride_x": "i32", "stride_dx": "i32", "M": "i32", "N": "i32"}
for single, affine in [(True, True), (False, True), (True, False)]:
    print(hopper_registers(_layernorm_fwd_kernel, fwd, {
        "BLOCK_N": 4096, "ROWS": 1, "SINGLE": single, "HAS_W": affine, "HAS_B": affine,
        "READ_ONCE": "evict_first", "READ_AGAIN": "evict_last", "PDL": True}, 4))
for single, regs, affine in [(True, True, True), (True, False, True), (False, False, True),
                             (True, True, False)]:
    print(hopper_registers(_layernorm_bwd_kernel, bwd, {
        "BLOCK_N": 4096, "ROWS": 1, "SINGLE": single, "DW_REGS": regs, "HAS_W": affine,
        "HAS_B": affine, "READ_ONCE": "", "READ_TWICE": "", "PDL": True}, 8))
"""


def test_every_path_compiles_for_hopper_within_the_registers() -> None:
    """Off the interpreter, which takes more than Triton's compiler does: the forward's whole
    and looped rows, the backward's partials in registers and in global memory, with and
    without weight and bias, compiled for sm_90 (offline), each in a thread's 255 registers."""
    registers = [int(v) for v in compiled_offline(_COMPILED).split()]
    assert len(registers) == 7 and all(0 < r < 255 for r in registers), registers


_WAITING_SPLIT = """
import sys
sys.path.insert(0, sys.argv[1])
from sass_mix import hopper_cubin, _cubin_tool, opcodes
from kerneltune.kernels._coop import resident_options
from kerneltune.kernels.layernorm_spec import BWD
from kerneltune.kernels.layernorm_bwd import _layernorm_bwd_split_kernel
sig = {"PART_1": "*fp32", "PART_2": "*fp32", "NQ": "i32", "DY": "*bf16", "X": "*bf16",
       "W": "*bf16", "MEAN": "*fp32", "RSTD": "*fp32", "DX": "*bf16", "DW_PART": "*fp32",
       "DB_PART": "*fp32", "DW": "*bf16", "DB": "*bf16", "stride_dy": "i32",
       "stride_x": "i32", "stride_dx": "i32", "M": "i32", "N": "i32"}
config = BWD.default(BWD.problem(4096, 16384))
cap = resident_options(config)["maxnreg"]
for affine in (True, False):
    cubin = hopper_cubin(_layernorm_bwd_split_kernel, sig, {
        "BLOCK_N": config.BLOCK_N, "ROWS": config.ROWS, "NQ_POW2": 4, "PHASE": 0,
        "DIRECT": False, "HAS_W": affine, "HAS_B": affine, "EVICT": config.EVICT, "PDL": True},
        config.num_warps, maxnreg=cap)
    usage = _cubin_tool("cuobjdump", cubin, "--dump-resource-usage")
    sass = _cubin_tool("nvdisasm", cubin, "-c")
    print(cap, usage.split("REG:")[1].split()[0], sass.count("ATOMG.E.EXCH.STRONG.GPU"),
          sass.count("LDG.E.STRONG.GPU"), opcodes(sass).count("PREEXIT"))
"""


def test_the_waiting_split_compiles_for_hopper_within_its_register_cap() -> None:
    """The backward's default split at 16K elements waits for its peers in one launch (PHASE
    0), which the interpreter never runs: compiled for sm_90 (offline) under the register cap
    that lets two programs share an SM, with and without weight and bias, it publishes both
    partials of the row block before the loop and of the next one in it (four exchanges),
    polls both gathered tiles, and releases the next grid once."""
    for line in compiled_offline(_WAITING_SPLIT).splitlines():
        cap, registers, exchanges, polls, releases = map(int, line.split())
        assert cap == 128 and registers <= cap
        assert exchanges == 4 and polls > 0 and releases == 1


# ----------------------------------------------------------------------------- backward


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("m", [1, 13])
def test_backward_default_matches_autograd(dtype: str, n: int, m: int, device: str) -> None:
    problem = BWD.problem(m, n, dtype)
    inputs = BWD.make_inputs(problem, seed=n + m, device=device)
    dx, dw, db = BWD.run(inputs, BWD.default(problem))
    assert dx.dtype == dw.dtype == db.dtype == problem.torch_dtype
    assert BWD.check(inputs, (dx, dw, db), autograd_grads(inputs)) is None
    assert BWD.check(inputs, (dx, dw, db)) is None


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_closed_form_reference_is_the_gradient(dtype: str) -> None:
    inputs = BWD.make_inputs(BWD.problem(5, 300, dtype), 3, "cpu")
    got = layernorm_bwd_ref(inputs["dy"], inputs["x"], inputs["weight"], inputs["mean"],
                            inputs["rstd"])
    # Only the saved fp32 mean and rstd differ from autograd's float64 ones.
    for ref, grad in zip(got, autograd_grads(inputs), strict=True):
        assert torch.allclose(ref, grad, rtol=1e-5, atol=1e-5 * grad.abs().max().item())


@pytest.mark.parametrize(("single", "dw_mode", "n"), [(True, "registers", 300),
                                                      (True, "global", 300),
                                                      (False, "global", 1100)])
def test_backward_programs_take_many_row_blocks(single: bool, dw_mode: str, n: int,
                                                device: str) -> None:
    """More row blocks than programs: each program loops and accumulates its partials."""
    m = 15 * sm_count(device) + 1
    problem = BWD.problem(m, n, "bfloat16")
    config = BackwardConfig(BLOCK_N=512, SINGLE=single, DW=dw_mode, ROWS=2 if single else 1,
                            GRID_MULT=1, EVICT=True, num_warps=4 if single else 2, num_stages=1)
    assert BWD.valid(problem, config)
    assert grid_size(m, config, sm_count(device)) < m // config.ROWS
    inputs = BWD.make_inputs(problem, seed=5, device=device)
    assert BWD.check(inputs, BWD.run(inputs, config), autograd_grads(inputs)) is None


@pytest.mark.parametrize(("weight", "bias"), [(False, False), (True, False), (False, True)])
def test_backward_without_weight_or_bias(weight: bool, bias: bool, device: str) -> None:
    """dx alone, or with dw or db: only the gradients of what there is."""
    problem = BWD.problem(6, 700, "float32")
    inputs = BWD.make_inputs(problem, seed=4, device=device)
    expected = autograd_grads(inputs, weight, bias)
    looped = BackwardConfig(BLOCK_N=512, SINGLE=False, DW="global", ROWS=1, GRID_MULT=1,
                            EVICT=False, num_warps=1, num_stages=2)
    # A row split over 3 programs: one lane, which writes dw and db itself, or five.
    split = looped.replace(BLOCK_N=256, DW="split", num_stages=1)
    for config in (BWD.default(problem), looped, split, split.replace(GRID_MULT=4)):
        out = layernorm_bwd(inputs["dy"], inputs["x"], inputs["weight"] if weight else None,
                            inputs["bias"] if bias else None, inputs["mean"], inputs["rstd"],
                            config)
        assert len(out) == 1 + weight + bias
        wanted = [g for g in expected if g is not None]
        for got, grad in zip(out, wanted, strict=True):
            assert torch.allclose(got.double(), grad, rtol=1e-4, atol=1e-4), config


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_backward_strided_rows(dtype: str, device: str) -> None:
    torch_dtype = TORCH_DTYPES[dtype]
    gen = torch.Generator().manual_seed(7)
    x = (torch.randn(9, 300, generator=gen) + 1).to(device, torch_dtype)[:, 50:250]
    dy = torch.randn(9, 517, generator=gen).to(device, torch_dtype)[:, 17:217]
    w, b = (torch.rand(2, 200, generator=gen) + 0.5).to(device, torch_dtype)
    mean = x.float().mean(-1)
    rstd = torch.rsqrt((x.float() - mean[:, None]).pow(2).mean(-1) + EPS)
    inputs = {"x": x, "dy": dy, "weight": w, "bias": b, "mean": mean, "rstd": rstd}
    looped = BackwardConfig(BLOCK_N=64, SINGLE=False, DW="global", ROWS=1, GRID_MULT=1,
                            EVICT=False, num_warps=1, num_stages=1)
    split = looped.replace(DW="split")  # 4 programs a row: one lane, or two
    for config in (BWD.default(BWD.problem(9, 200, dtype)), looped, split,
                   split.replace(GRID_MULT=2)):
        out = layernorm_bwd(dy, x, w, b, mean, rstd, config)
        assert out[0].is_contiguous() and out[0].shape == x.shape
        assert BWD.check(inputs, out, autograd_grads(inputs)) is None


def test_backward_of_no_rows(device: str) -> None:
    x = torch.empty(0, 96, device=device, dtype=torch.bfloat16)
    w, b = torch.ones(96, device=device), torch.ones(96, device=device, dtype=torch.float16)
    stats = torch.empty(0, device=device)
    default = BWD.default(BWD.problem(1, 96))
    split = default.replace(BLOCK_N=32, SINGLE=False, DW="split", num_warps=1)
    for config in (default, split):
        dx, dw, db = layernorm_bwd(x, x, w, b, stats, stats, config)
        assert dx.shape == (0, 96) and dw.dtype == torch.float32 and db.dtype == torch.float16
        assert not dw.any() and not db.any()


def test_backward_refuses_a_partial_mode_it_does_not_have() -> None:
    config = BWD.default(BWD.problem(4, 64)).replace(DW="columns")
    x, stats = torch.empty(4, 64, device="meta"), torch.empty(4, device="meta")
    with pytest.raises(ValueError, match=r"cannot launch.*DW='columns'"):
        layernorm_bwd(x, x, None, None, stats, stats, config)
    assert not BWD.valid(BWD.problem(4, 64), config)


def test_backward_check_detects_wrong_output(device: str) -> None:
    """A perturbed dx, a dw or db that lost a row, NaN."""
    inputs = BWD.make_inputs(BWD.problem(13, 256, "bfloat16"), 4, device)
    dx, dw, db = BWD.run(inputs, BWD.default(BWD.problem(13, 256)))
    bad = dx.clone()
    bad[2, 17] = bad[2, 17] * 1.05 + 0.01
    assert BWD.check(inputs, (bad, dw, db)).startswith("dx")
    bad[2, 17] = float("nan")
    assert "non-finite" in BWD.check(inputs, (bad, dw, db))
    row = inputs["dy"][7].double()
    xhat = (inputs["x"][7].double() - inputs["mean"][7]) * inputs["rstd"][7]
    assert BWD.check(inputs, (dx, (dw.double() - row * xhat).to(dw.dtype), db)).startswith("dw")
    assert BWD.check(inputs, (dx, dw, (db.double() - row).to(db.dtype))).startswith("db")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_backward_config_of_the_space_is_correct(data: st.DataObject) -> None:
    config, inputs = draw_case(data, BWD)
    assert BWD.check(inputs, BWD.run(inputs, config)) is None, config


# ------------------------------------------------------------------------ backward's split


def split_of(block: int, rows: int = 1, per_sm: int = 1, warps: int = 2) -> BackwardConfig:
    return BackwardConfig(BLOCK_N=block, SINGLE=False, PREFETCH=False, DW="split", ROWS=rows,
                          GRID_MULT=per_sm, EVICT=rows == 1, num_warps=warps, num_stages=1)


@pytest.mark.parametrize(("m", "n", "dtype", "rows", "per_sm", "warps", "lanes"), [
    (13, 1100, "bfloat16", 1, 1, 2, 1),  # 3 programs a row, padded: one lane
    (21, 1100, "bfloat16", 1, 4, 2, 5),  # five lanes, each taking several row blocks
    (37, 1024, "float16", 2, 1, 2, 2),  # 2 a row, two rows a block
    (9, 2000, "float32", 4, 1, 4, 1),  # 4 a row, a last block of one row
    (1, 1100, "float32", 1, 1, 2, 1),  # one row
])
def test_split_rows(m: int, n: int, dtype: str, rows: int, per_sm: int, warps: int, lanes: int,
                    device: str) -> None:
    """A row split over programs: both partials of every chunk reach every program of its
    lane, each lane's dw and db partials cover its own row blocks (one lane writes them
    itself, with no reduction), and the outputs come out the same run after run."""
    problem = BWD.problem(m, n, dtype)
    config = split_of(512, rows, per_sm, warps)
    assert BWD.valid(problem, config)
    inputs = BWD.make_inputs(problem, seed=m, device=device)
    assert _coop.lane_count(inputs["x"], config) == lanes
    call = describe_layernorm_bwd(inputs["dy"], inputs["x"], inputs["weight"], inputs["bias"],
                                  inputs["mean"], inputs["rstd"], config)
    phases = _coop.phases(triton.cdiv(n, 512), sm_count(device), 1)  # one waiting, or 2 steps
    assert [launch.kernel for launch in call.launches] == [
        fill_unset, *[_layernorm_bwd_split_kernel] * len(phases),
        *[_dw_reduce_kernel] * 2 * (lanes > 1)]
    out = BWD.run(inputs, config)
    assert BWD.check(inputs, out, autograd_grads(inputs)) is None
    assert BWD.check(inputs, out) is None
    assert all(torch.equal(a, b) for a, b in zip(out, BWD.run(inputs, config), strict=True))


def test_split_launches_wait_once_where_a_lane_is_resident(monkeypatch) -> None:
    """Off the interpreter, a row of at most SMs chunks splits in one launch whose programs
    wait for each other (PHASE 0), both partials of the row's one agreement in two buffers;
    wider rows, which could never be resident at once, in its two steps apart."""
    monkeypatch.setattr(_coop, "interpreting", lambda: False)  # launch as on a GPU
    x = torch.empty(9, 2000, dtype=torch.bfloat16, device="meta")
    w, stats = torch.empty(2000, device="meta"), torch.empty(9, device="meta")
    for block, phases in ((512, [0]), (256, [1, 2])):  # 4 and 8 chunks on 4 SMs
        call = describe_layernorm_bwd(x, x, w, w, stats, stats, split_of(block, per_sm=2))
        (parts,) = call.scratch
        assert parts.shape == (2, 9, triton.cdiv(2000, block))
        splits = [launch for launch in call.launches
                  if launch.kernel is _layernorm_bwd_split_kernel]
        assert [launch.meta["PHASE"] for launch in splits] == phases
        assert all(launch.args[2] == parts.shape[2] for launch in splits)  # after the buffers


def test_split_space() -> None:
    """As the RMSNorm backward's split: 2 to MAX_SPLIT programs of at least MIN_LOOP_BLOCK
    columns, GRID_MULT of them per SM in up to 32 warps and 16K elements (8K if several), no
    pipelining stages; what a program keeps live (three blocks of x and dy as stored, w and
    two partials) fits its registers."""
    problem = BWD.problem(4096, 65536, "bfloat16")
    base = split_of(4096, rows=2, warps=16)
    assert "split" in BWD.space(problem)["DW"]
    assert BWD.valid(problem, base)
    assert triton.cdiv(problem.n, 1024) == MAX_SPLIT
    assert BWD.valid(problem, base.replace(BLOCK_N=1024, num_warps=4))
    assert not BWD.valid(problem, base.replace(BLOCK_N=512, num_warps=4))  # 128
    assert BWD.valid(problem, base.replace(ROWS=1, GRID_MULT=2, num_warps=8))
    assert not BWD.valid(problem, base.replace(GRID_MULT=2))  # 16K elements an SM
    assert not BWD.valid(problem, base.replace(ROWS=1, GRID_MULT=4))  # 64 warps an SM
    assert not BWD.valid(problem, base.replace(ROWS=1, GRID_MULT=2, num_warps=4))  # registers
    assert not BWD.valid(problem, base.replace(num_warps=8))  # registers
    assert not BWD.valid(problem, base.replace(num_stages=2))
    assert not BWD.valid(problem, base.replace(SINGLE=True))
    assert not BWD.valid(problem, base.replace(PREFETCH=True))
    assert not BWD.valid(problem, base.replace(ROWS=8))  # 32K values a block
    assert not BWD.valid(BWD.problem(4096, 4096, "bfloat16"), base)  # one chunk is no split
    assert not BWD.valid(BWD.problem(4096, 16384, "float32"), split_of(4096, per_sm=2, warps=8))
    assert any(c.DW == "split" for c in BWD.configs(BWD.problem(64, 3584)))


@pytest.mark.parametrize(("n", "dtype", "dw_mode", "candidates"), [
    (8192, "bfloat16", "registers", 0),  # the whole row
    (8193, "bfloat16", "split", 3),
    (16384, "bfloat16", "split", 3),
    (16384, "float16", "split", 3),
    (16384, "float32", "split", 0),  # 2K chunks fit fp32's blocks; no named split does
    (40000, "bfloat16", "split", 3),
    (40000, "float32", "split", 0),
    (2048 * 64 + 1, "bfloat16", "global", 2),  # beyond 64 chunks of 2K: looped
    (4096 * 64 + 1, "bfloat16", "global", 1),  # beyond 64 chunks of 4K
])
def test_split_default_and_candidates_for_long_rows(n: int, dtype: str, dw_mode: str,
                                                    candidates: int) -> None:
    """Rows of more than 8K elements take the split of 2K chunks where it is valid (else 4K
    chunks looped); a search tries the RMSNorm backward's named splits early where they are
    valid."""
    problem = BWD.problem(4096, n, dtype)
    default = BWD.default(problem)
    assert dw_mode == default.DW and BWD.valid(problem, default)
    assert default.SINGLE is (n <= 16384 and dw_mode != "split")
    if dw_mode == "split":
        assert default == split_of(2048, per_sm=2, warps=8).replace(EVICT=False)
    found = BWD.candidates(problem)
    assert len(found) == candidates
    assert all(c.DW == "split" and BWD.valid(problem, c) for c in found)


@triton.jit
def _partials_of(DY, X, W, MEAN, S1, S2, N, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
                 HAS_W: tl.constexpr):
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    ptrs = rows[:, None] * N + cols[None, :]
    s1, s2 = _chunk_partials(tl.load(DY + ptrs), tl.load(X + ptrs), W, cols, cols < N,
                             tl.load(MEAN + rows), HAS_W)
    tl.store(S1 + rows, s1)
    tl.store(S2 + rows, s2)


@pytest.mark.parametrize("has_w", [True, False])
def test_a_partial_of_minus_one_is_published_next_to_it(has_w: bool, device: str) -> None:
    """A slot holding -1 reads as not yet published: a chunk's Σ (x − mean) · w · dy or
    Σ w · dy of exactly -1 goes out as the fp32 value next to it, the others exact."""
    dy, x = (torch.zeros(4, 16, device=device) for _ in range(2))
    dy[:, 0] = torch.tensor([-1.0, 2.0, -0.5, 1.0])
    x[:, 0] = torch.tensor([2.0, 3.0, 3.0, -0.5])
    mean = torch.tensor([1.0, 0.0, 1.0, 0.5], device=device)  # (x − mean) · dy: -1, 6, -1, -1
    s1, s2 = (torch.empty(4, device=device) for _ in range(2))
    _partials_of[(1,)](dy, x, torch.ones(16, device=device), mean, s1, s2, 16, BLOCK_N=16,
                       ROWS=4, HAS_W=has_w)
    near = NEXT_TO_UNSET.value
    assert s1.tolist() == [near, 6.0, near, near]
    assert s2.tolist() == [near, 2.0, -0.5, 1.0]


@pytest.mark.timeout(60)  # a slot left at -1 would be read again for ever
def test_a_split_row_whose_chunk_sums_are_minus_one_comes_out_right(device: str) -> None:
    """End to end: the first chunk of row 0 sums to exactly -1 in both partials (x − mean = 1
    where dy = -1, no weight), which the gather would otherwise take for unpublished."""
    m, n = 3, 1024
    gen = torch.Generator().manual_seed(3)
    x = torch.tensor([1.0, -1.0]).repeat(m, n // 2)  # mean 0, var 1
    dy = torch.randn(m, n, generator=gen)
    dy[0, :512] = 0.0
    dy[0, 0] = -1.0
    x, dy = x.to(device), dy.to(device)
    mean = torch.zeros(m, device=device)
    rstd = torch.rsqrt(torch.ones(m, device=device) + EPS)
    bias = torch.zeros(n, device=device)
    for config in (split_of(512), split_of(512, per_sm=2)):  # one lane, two
        dx, db = layernorm_bwd(dy, x, None, bias, mean, rstd, config)
        want_dx, _, want_db = layernorm_bwd_ref(dy, x, None, mean, rstd)
        assert torch.allclose(dx.double(), want_dx, rtol=1e-5, atol=1e-6), config
        assert torch.allclose(db.double(), want_db, rtol=1e-5, atol=1e-6), config
