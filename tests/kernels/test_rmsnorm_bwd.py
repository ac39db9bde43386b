"""RMSNorm backward under the Triton interpreter against float64 autograd and its closed form."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_cases import draw_case

from kerneltune.kernels import BackwardConfig, _coop, _coop_dependent, _spec, rmsnorm_bwd_spec
from kerneltune.kernels._spec import MIN_LOOP_BLOCK, TORCH_DTYPES, sm_count
from kerneltune.kernels.rmsnorm_bwd import (
    NEXT_TO_UNSET,
    REDUCE_MAX_ROWS,
    REDUCE_MIN_ROWS,
    REDUCE_MIN_TILE,
    REDUCE_TILE,
    _chunk_dots,
    grid_size,
    reduce_launch,
    rmsnorm_bwd,
)
from kerneltune.kernels.rmsnorm_bwd_spec import (
    SPEC,
    dw_terms_ref,
    fp32_error_bounds,
    rmsnorm_bwd_ref,
)

DTYPES = ["float32", "float16", "bfloat16"]
NS = [1, 7, 64, 100, 3584, 4096, 5120]
EPS = 1e-6


def autograd_grads(inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """dx and dw by float64 autograd through the forward's formula.

    In llama mode the forward multiplies w by x̂ rounded to x's dtype (the fp32 product, as the
    forward computes it); the rounding passes the gradient straight through, as a cast does.
    """
    x, dy, w, rstd, offset = (inputs[k] for k in ("x", "dy", "weight", "rstd", "offset"))
    x64 = x.double().requires_grad_()
    w64 = w.double().requires_grad_()
    xhat = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS)
    if offset != 0.0:
        y = xhat * (offset + w64)
    else:
        rounded = (x.float() * rstd[:, None]).to(x.dtype).double()
        y = w64 * (xhat + (rounded - xhat).detach())
    y.backward(dy.double())
    return x64.grad, w64.grad


def inputs_for(m: int, n: int, dtype: str, offset: float, device: str, seed: int = 0) -> dict:
    return SPEC.make_inputs(SPEC.problem(m, n, dtype, offset=offset), seed, device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("m", [1, 13])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_default_config_matches_autograd(dtype: str, n: int, m: int, offset: float,
                                         device: str) -> None:
    problem = SPEC.problem(m, n, dtype, offset=offset)
    inputs = SPEC.make_inputs(problem, seed=n + m, device=device)
    dx, dw = SPEC.run(inputs, SPEC.default(problem))
    assert dx.dtype == dw.dtype == problem.torch_dtype
    assert SPEC.check(inputs, (dx, dw), autograd_grads(inputs)) is None
    assert SPEC.check(inputs, (dx, dw)) is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_closed_form_reference_is_the_gradient(dtype: str, offset: float) -> None:
    inputs = inputs_for(5, 300, dtype, offset, "cpu", seed=3)
    dx, dw = rmsnorm_bwd_ref(inputs["dy"], inputs["x"], inputs["weight"], inputs["rstd"], offset)
    gx, gw = autograd_grads(inputs)
    # Only the saved rstd (fp32) differs from autograd's float64 one: ~1e-7 relative.
    assert torch.allclose(dx, gx, rtol=1e-6, atol=1e-6 * gx.abs().max().item())
    assert torch.allclose(dw, gw, rtol=1e-6, atol=1e-6 * gw.abs().max().item())


def test_the_reference_and_bounds_taken_a_few_rows_at_a_time_match_the_whole(monkeypatch
                                                                           ) -> None:
    """The check's float64 work goes `row_blocks` at a time (memory); the blocks, a last one
    short among them, give dx and its bounds exactly and dw to float64 rounding."""
    inputs = inputs_for(37, 300, "bfloat16", 0.0, "cpu", seed=5)
    whole_ref, whole_bounds = SPEC.reference(inputs), fp32_error_bounds(inputs, 4)
    monkeypatch.setattr(_spec, "CHECK_ELEMS", 8 * 300)
    blocks = _spec.row_blocks(37, 300)
    assert len(blocks) == 5
    blocked_ref = SPEC.reference(inputs)
    parts = [fp32_error_bounds(inputs, 4, rows) for rows in blocks]
    blocked_bounds = (torch.cat([dx for dx, _ in parts]), sum(dw for _, dw in parts))
    for whole, blocked in ((whole_ref, blocked_ref), (whole_bounds, blocked_bounds)):
        assert torch.equal(blocked[0], whole[0])
        assert torch.allclose(blocked[1], whole[1], rtol=1e-13, atol=0)
    dx, dw = rmsnorm_bwd_ref(inputs["dy"], inputs["x"], inputs["weight"], inputs["rstd"])
    assert torch.equal(whole_ref[0], dx)
    assert torch.allclose(whole_ref[1], dw, rtol=1e-13, atol=0)


@pytest.mark.parametrize("with_expected", [False, True])
def test_the_check_a_few_rows_at_a_time_reaches_the_whole_checks_verdicts(
        with_expected: bool, monkeypatch) -> None:
    """Blocks of rows (memory: `SPEC.check`) pass what the one-block check passes and reject a
    dx off in a later block, naming its rows, and a dw that lost a row."""
    inputs = inputs_for(37, 300, "bfloat16", 0.0, "cpu", seed=6)
    dx, dw = (t.to(torch.bfloat16) for t in SPEC.reference(inputs))
    expected = autograd_grads(inputs) if with_expected else None
    bad = dx.clone()
    bad[33, 5] = bad[33, 5] * 1.05 + 0.01
    terms = dw_terms_ref(inputs["dy"], inputs["x"], inputs["rstd"], 0.0)
    lost = (dw.double() - terms[30]).to(dw.dtype)
    whole = [SPEC.check(inputs, out, expected) for out in ((dx, dw), (bad, dw), (dx, lost))]
    monkeypatch.setattr(_spec, "CHECK_ELEMS", 8 * 300)
    seen: list[int] = []

    def reference(dy, x, *args):
        seen.append(len(x))
        return rmsnorm_bwd_ref(dy, x, *args)

    monkeypatch.setattr(rmsnorm_bwd_spec, "rmsnorm_bwd_ref", reference)
    blocked = [SPEC.check(inputs, out, expected) for out in ((dx, dw), (bad, dw), (dx, lost))]
    assert max(seen, default=0) <= 8 and (seen == []) == with_expected
    assert whole[0] is None and blocked[0] is None
    assert whole[1].startswith("dx: 1/11100 values off")
    assert blocked[1].startswith("dx, rows 32-36: 1/1500 values off")
    assert whole[2].startswith("dw: ") and blocked[2] == whole[2]


def test_the_column_split_where_a_split_does_not_fit() -> None:
    """Beyond MAX_SPLIT chunks of the default split's 4K (256K elements) the rows are split
    by columns."""
    problem = SPEC.problem(3, 4096 * 64 + 1, "float32")
    assert SPEC.default(problem).DW == "columns"
    assert SPEC.valid(problem, SPEC.default(problem))


@pytest.mark.parametrize(("dtype", "offset"), [("bfloat16", 0.0), ("float32", 1.0)])
def test_long_rows_loop(dtype: str, offset: float, device: str) -> None:
    problem = SPEC.problem(3, 40000, dtype, offset=offset)
    config = SPEC.default(problem)
    # The row split over 4K chunks of one row, bf16 or fp32 (the column split where those do
    # not fit registers: `test_the_column_split_where_a_split_does_not_fit`).
    assert config.SINGLE is False
    assert config.DW == "split"
    assert SPEC.default(SPEC.problem(3, 30000, dtype)).DW == config.DW  # beyond 16K
    assert SPEC.default(SPEC.problem(3, 16384, dtype)).DW == "registers"
    inputs = SPEC.make_inputs(problem, seed=1, device=device)
    expected = autograd_grads(inputs)
    for dw_mode in ("global", "columns", "split"):
        config = config.replace(DW=dw_mode, ROWS=1)
        assert SPEC.check(inputs, SPEC.run(inputs, config), expected) is None, dw_mode


@pytest.mark.parametrize(("m", "n", "block", "rows"), [
    (13, 1100, 512, 1),   # 3 programs a row, padded: one lane on the interpreter's 4 SMs
    (37, 1024, 512, 2),   # 2 a row: two lanes, each taking many row blocks
    (9, 2000, 512, 4),    # 4 a row, a last block of one row
])
def test_split_rows(m: int, n: int, block: int, rows: int, device: str) -> None:
    """A row split over programs: every chunk's dot reaches every program of its lane, each
    lane's dw partial covers its own row blocks, and dx comes out the same run after run."""
    problem = SPEC.problem(m, n, "bfloat16", offset=1.0 if rows == 2 else 0.0)
    config = BackwardConfig(BLOCK_N=block, SINGLE=False, PREFETCH=False, DW="split",
                            ROWS=rows, GRID_MULT=1, EVICT=rows == 1, num_warps=2,
                            num_stages=1)
    assert SPEC.valid(problem, config)
    lanes = _coop.lanes(m, rows, triton.cdiv(n, block), sm_count(device))
    assert lanes * triton.cdiv(n, block) <= max(sm_count(device), triton.cdiv(n, block))
    inputs = SPEC.make_inputs(problem, seed=m, device=device)
    dx, dw = SPEC.run(inputs, config)
    assert SPEC.check(inputs, (dx, dw), autograd_grads(inputs)) is None
    again = SPEC.run(inputs, config)
    assert torch.equal(dx, again[0]) and torch.equal(dw, again[1])


@pytest.mark.timeout(60)  # launched to wait, program 0 would wait for ever
def test_split_too_wide_for_the_gpu_runs_step_by_step(monkeypatch: pytest.MonkeyPatch,
                                                       device: str) -> None:
    """More programs a row than SMs could never all be resident: off the interpreter the
    launcher runs such a split as two launches, the dots and then dx and dw (on a GPU too,
    told it has 4 SMs)."""
    monkeypatch.setattr(_coop, "interpreting", lambda: False)  # launch as on a GPU
    monkeypatch.setattr(_coop_dependent, "sm_count", lambda device: 4)
    launches: list[tuple[int, ...]] = []

    def phases(chunks: int, sms: int, steps: int) -> tuple[int, ...]:
        launches.append(_coop.phases(chunks, sms, steps))
        return launches[-1]

    monkeypatch.setattr(_coop_dependent, "phases", phases)
    problem = SPEC.problem(6, 3000, "bfloat16")  # 6 chunks of 512
    split = BackwardConfig(BLOCK_N=512, SINGLE=False, PREFETCH=False, DW="split", ROWS=1,
                           GRID_MULT=1, EVICT=False, num_warps=2, num_stages=1)
    assert SPEC.valid(problem, split)
    inputs = SPEC.make_inputs(problem, seed=8, device=device)
    assert SPEC.check(inputs, SPEC.run(inputs, split), autograd_grads(inputs)) is None
    assert launches == [(1, 2)]  # the dots, then dx and dw: nothing waits


@triton.jit
def _dots_of(DY, X, W, OUT, N, BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    ptrs = rows[:, None] * N + cols[None, :]
    w = tl.load(W + cols).to(tl.float32)
    tl.store(OUT + rows, _chunk_dots(tl.load(DY + ptrs), tl.load(X + ptrs), w))


def test_a_dot_of_minus_one_is_published_next_to_it(device: str) -> None:
    """A slot holding -1 reads as not yet published, where a waiting gather would spin for
    ever: a chunk's dot of exactly -1 goes out as the fp32 value next to it, others exact."""
    dy, x = (torch.zeros(4, 16, dtype=torch.bfloat16, device=device) for _ in range(2))
    dy[:, 0] = torch.tensor([-1.0, 2.0, -0.5, 0.0])
    x[:, 0] = torch.tensor([1.0, 3.0, 2.0, 5.0])
    out = torch.empty(4, device=device)
    _dots_of[(1,)](dy, x, torch.ones(16, dtype=torch.bfloat16, device=device), out, 16,
                   BLOCK_N=16, ROWS=4)
    assert NEXT_TO_UNSET.value == torch.nextafter(torch.tensor(-1.0), torch.tensor(0.0)).item()
    assert out.tolist() == [NEXT_TO_UNSET.value, 6.0, NEXT_TO_UNSET.value, 0.0]


@pytest.mark.parametrize(("dw_mode", "n", "block", "warps"), [("registers", 2048, 2048, 4),
                                                              ("split", 2000, 1024, 2)])
def test_one_row_block_writes_dw_itself(dw_mode: str, n: int, block: int, warps: int,
                                        device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where one program holds all of a column's rows, it writes dw: no reduction launch."""
    from kerneltune.kernels import rmsnorm_bwd as device_code

    problem = SPEC.problem(2, n, "bfloat16")
    config = BackwardConfig(BLOCK_N=block, SINGLE=dw_mode == "registers", PREFETCH=False,
                            DW=dw_mode, ROWS=2, GRID_MULT=1, EVICT=False, num_warps=warps,
                            num_stages=1)
    assert SPEC.valid(problem, config)
    inputs = SPEC.make_inputs(problem, seed=n, device=device)
    expected = autograd_grads(inputs)
    monkeypatch.setattr(device_code, "_dw_reduce_kernel", None)  # launching it would raise
    assert SPEC.check(inputs, SPEC.run(inputs, config), expected) is None
    with pytest.raises(TypeError):  # two row blocks, two programs a column: partials to reduce
        SPEC.run(inputs, config.replace(ROWS=1))


def test_split_space() -> None:
    """A split row takes 2 to MAX_SPLIT programs of at least MIN_LOOP_BLOCK columns, GRID_MULT
    of them per SM in up to 32 warps and 16K elements (8K if several), and no pipelining
    stages."""
    problem = SPEC.problem(4096, 65536, "bfloat16")
    base = BackwardConfig(BLOCK_N=4096, SINGLE=False, PREFETCH=False, DW="split", ROWS=2,
                          GRID_MULT=1, EVICT=False, num_warps=8, num_stages=1)
    assert SPEC.valid(problem, base)
    assert SPEC.valid(problem, base.replace(BLOCK_N=1024))  # 64 programs a row
    assert not SPEC.valid(problem, base.replace(BLOCK_N=512))  # 128
    assert SPEC.valid(problem, base.replace(ROWS=1, GRID_MULT=2))
    assert not SPEC.valid(problem, base.replace(GRID_MULT=2))  # 16K elements an SM
    assert not SPEC.valid(problem, base.replace(ROWS=1, BLOCK_N=2048, GRID_MULT=8))  # 64 warps
    assert not SPEC.valid(problem, base.replace(ROWS=1, GRID_MULT=4, num_warps=4))  # 16K
    assert not SPEC.valid(problem, base.replace(num_stages=2))
    assert not SPEC.valid(problem, base.replace(SINGLE=True))
    assert not SPEC.valid(problem, base.replace(ROWS=8))  # 32K values a block
    assert not SPEC.valid(SPEC.problem(4096, 4096, "bfloat16"), base)  # one chunk is no split
    assert any(c.DW == "split" for c in SPEC.configs(problem))


def test_split_candidates_for_long_rows_only() -> None:
    """A search tries the named splits early where they are valid splits; a short row has none."""
    long_rows = SPEC.problem(4096, 65536, "bfloat16")
    candidates = SPEC.candidates(long_rows)
    assert len(candidates) == 5
    assert all(c.DW == "split" and SPEC.valid(long_rows, c) for c in candidates)
    assert SPEC.candidates(SPEC.problem(4096, 8192, "bfloat16")) == []


@pytest.mark.parametrize(("single", "dw_mode", "prefetch"), [
    (True, "registers", False), (True, "registers", True), (True, "global", False),
    (True, "global", True), (False, "global", False), (False, "columns", False)])
def test_persistent_programs_take_many_row_blocks(dw_mode: str, single: bool, prefetch: bool,
                                                  device: str) -> None:
    """More row blocks than programs: each program loops and accumulates its dw partial (with
    PREFETCH, loading each block one iteration ahead, past the last one for some programs)."""
    m = 15 * sm_count(device) + 1  # 61 on the interpreter's 4 SMs
    problem = SPEC.problem(m, 300 if single else 1100, "bfloat16")
    rows = 2 if single else 1  # looping is for long rows, one per program
    config = BackwardConfig(BLOCK_N=512, SINGLE=single, PREFETCH=prefetch, DW=dw_mode,
                            ROWS=rows, GRID_MULT=1, EVICT=True, num_warps=4 if single else 2,
                            num_stages=1)
    assert SPEC.valid(problem, config)
    assert grid_size(m, config, sm_count(device)) < triton.cdiv(m, rows)
    inputs = SPEC.make_inputs(problem, seed=5, device=device)
    assert SPEC.check(inputs, SPEC.run(inputs, config)) is None


def test_the_reduction_sums_up_to_512_partials_in_one_step() -> None:
    """Each program of the dw reduction adds its columns of every partial row in one step where
    there are up to REDUCE_MAX_ROWS of them (the steps wait on each other), in a tile of at
    most REDUCE_TILE values with no masked row where there are fewer, at least 32 columns
    where the partials are few, and its programs cover the columns once."""
    for n, g in ((1024, 264), (4096, 528), (1024, 8), (8192, 16), (1024, 128), (100, 3),
                 (262144, 264), (65536, 1056), (262144, 4), (131072, 8), (4096, 1)):
        programs, block_c, block_g, warps = reduce_launch(n, g, 132)
        assert (programs - 1) * block_c < n <= programs * block_c
        assert triton.cdiv(g, block_g) == triton.cdiv(g, REDUCE_MAX_ROWS)
        assert block_g < 2 * g or block_g == REDUCE_MAX_ROWS
        assert block_c * block_g <= REDUCE_TILE
        assert block_c * max(block_g, REDUCE_MIN_ROWS) >= REDUCE_MIN_TILE
        assert 1 <= warps <= 8 and block_c >= 8
    # Many partials of short rows: the narrowest columns, so that most SMs take a share.
    assert reduce_launch(1024, 264, 132)[:2] == (128, 8)
    # A few partials of a long row: the tile's width in columns, not 16 rows of which 12 masked.
    assert reduce_launch(262144, 4, 132)[:3] == (256, 1024, 4)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_strided_rows(dtype: str, device: str) -> None:
    torch_dtype = TORCH_DTYPES[dtype]
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(9, 300, generator=gen).to(device, torch_dtype)[:, 50:250]
    dy = torch.randn(9, 517, generator=gen).to(device, torch_dtype)[:, 17:217]
    assert x.stride(0) == 300 and dy.stride(0) == 517
    w = (torch.rand(200, generator=gen) + 0.5).to(device, torch_dtype)
    rstd = torch.rsqrt(x.float().pow(2).mean(-1) + EPS)
    inputs = {"x": x, "dy": dy, "weight": w, "rstd": rstd, "offset": 0.0}
    looped = BackwardConfig(BLOCK_N=64, SINGLE=False, DW="global", ROWS=1, GRID_MULT=1,
                            EVICT=False, num_warps=1, num_stages=2)
    for config in (SPEC.default(SPEC.problem(9, 200, dtype)), looped,
                   looped.replace(DW="columns", ROWS=2)):
        dx, dw = rmsnorm_bwd(dy, x, w, rstd, 0.0, config)
        assert dx.is_contiguous() and dx.shape == x.shape
        assert SPEC.check(inputs, (dx, dw), autograd_grads(inputs)) is None


def test_no_rows(device: str) -> None:
    x = torch.empty(0, 96, device=device, dtype=torch.bfloat16)
    w = torch.ones(96, device=device, dtype=torch.float32)
    rstd = torch.empty(0, device=device)
    dx, dw = rmsnorm_bwd(x, x, w, rstd, 0.0, SPEC.default(SPEC.problem(1, 96)))
    assert dx.shape == (0, 96) and dx.dtype == torch.bfloat16
    assert dw.dtype == torch.float32 and torch.equal(dw.cpu(), torch.zeros(96))


def test_weight_dtype_sets_dw_dtype(device: str) -> None:
    inputs = inputs_for(6, 100, "bfloat16", 1.0, device, seed=2)
    inputs["weight"] = inputs["weight"].float()
    dx, dw = SPEC.run(inputs, SPEC.default(SPEC.problem(6, 100)))
    assert dx.dtype == torch.bfloat16 and dw.dtype == torch.float32
    assert SPEC.check(inputs, (dx, dw)) is None


def test_detects_wrong_output(device: str) -> None:
    """The checker the tuner relies on rejects a perturbed dx, a lost row in dw, NaN."""
    inputs = inputs_for(13, 256, "bfloat16", 0.0, device, seed=4)
    dx, dw = SPEC.run(inputs, SPEC.default(SPEC.problem(13, 256)))
    bad = dx.clone()
    bad[2, 17] = bad[2, 17] * 1.05 + 0.01
    assert "dx" in SPEC.check(inputs, (bad, dw))
    bad[2, 17] = float("nan")
    assert "non-finite" in SPEC.check(inputs, (bad, dw))
    terms = dw_terms_ref(inputs["dy"], inputs["x"], inputs["rstd"], 0.0)
    lost = (dw.double() - terms[7].to(dw.device)).to(dw.dtype)
    assert "dw" in SPEC.check(inputs, (dx, lost))
    assert "dtype" in SPEC.check(inputs, (dx, dw.float()))


@pytest.mark.parametrize("dtype", DTYPES)
def test_dw_bound_catches_a_lost_row_at_large_m(dtype: str, device: str) -> None:
    """The fp32 summation allowance grows with M, yet stays below one row's contribution."""
    inputs = inputs_for(8192, 64, dtype, 1.0, device, seed=9)
    dx, dw = (t.to(TORCH_DTYPES[dtype]) for t in SPEC.reference(inputs))
    assert SPEC.check(inputs, (dx, dw)) is None
    terms = dw_terms_ref(inputs["dy"], inputs["x"], inputs["rstd"], 1.0)
    for row in (0, 4321):
        lost = (dw.double() - terms[row].to(dw.device)).to(dw.dtype)
        assert "dw" in SPEC.check(inputs, (dx, lost))


def test_bytes_moved() -> None:
    problem = SPEC.problem(4096, 5120, "bfloat16")
    assert SPEC.bytes_moved(problem) == 3 * 4096 * 5120 * 2 + 2 * 5120 * 2 + 4 * 4096


@pytest.mark.parametrize("n", [1, 100, 3584, 4096, 8192, 16384, 40000, 65536, 200_000, 262144])
@pytest.mark.parametrize("m", [1, 7, 3000, 65536])
@pytest.mark.parametrize("dtype", DTYPES)
def test_default_is_valid(m: int, n: int, dtype: str) -> None:
    problem = SPEC.problem(m, n, dtype)
    config = SPEC.default(problem)
    assert set(config) == set(SPEC.space(problem))
    assert all(config[k] in choices for k, choices in SPEC.space(problem).items())
    assert SPEC.valid(problem, config)
    assert SPEC.rejects(problem, config) is None


@pytest.mark.parametrize(("m", "n"), [(64, 3584), (1, 100), (4096, 262144)])
def test_every_enumerated_config_is_valid(m: int, n: int) -> None:
    problem = SPEC.problem(m, n, "bfloat16")
    configs = list(SPEC.configs(problem))
    assert len(configs) > 20
    assert all(SPEC.valid(problem, c) for c in configs)
    if MIN_LOOP_BLOCK < n <= 8192:
        assert {c.SINGLE for c in configs} == {True, False}
        assert {c.DW for c in configs} == {"registers", "global", "columns", "split"}
    assert all(c.DW != "registers" for c in configs if not c.SINGLE)
    assert all(c.DW not in ("columns", "split") for c in configs if c.SINGLE)


def test_space_prunes_what_cannot_fit() -> None:
    problem = SPEC.problem(4096, 16384, "bfloat16")
    base = BackwardConfig(BLOCK_N=16384, SINGLE=True, DW="registers", ROWS=1, GRID_MULT=1,
                          EVICT=True, num_warps=16, num_stages=1)
    assert SPEC.valid(problem, base)  # x, dy, w and the dw partial: 128 values a thread
    assert not SPEC.valid(problem, base.replace(num_warps=8))  # 256 a thread
    assert not SPEC.valid(problem, base.replace(PREFETCH=True))  # and the next block
    assert not SPEC.valid(problem, base.replace(SINGLE=False))  # one chunk is not a loop
    assert not SPEC.valid(problem, base.replace(BLOCK_N=4096, SINGLE=False))  # DW registers
    assert SPEC.valid(problem, base.replace(BLOCK_N=4096, SINGLE=False, DW="global"))
    # 4096 · 4 live values on one warp spill
    assert not SPEC.valid(problem, base.replace(BLOCK_N=4096, SINGLE=False, DW="global",
                                                num_warps=1))


# Small shapes: under the interpreter a looped config's cost grows with its chunk count.
PROBLEMS = [(3, 100, "float32"), (37, 700, "bfloat16"), (2, 1500, "float16"),
            (17, 64, "bfloat16"), (5, 300, "float32")]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_config_of_the_space_is_correct(data: st.DataObject) -> None:
    _, config, inputs = draw_case(data, SPEC, PROBLEMS, "offset", [0.0, 1.0])
    assert SPEC.check(inputs, SPEC.run(inputs, config)) is None, config
