"""Whole rows on a persistent grid (GRID_MULT > 1 without COOP) in the forward, add + norm and
quant, under the Triton interpreter (quant's candidates: test_rmsnorm_quant.py)."""

from __future__ import annotations

import pytest

from kerneltune.kernels._spec import KernelSpec, next_pow2, sm_count
from kerneltune.kernels.add_rmsnorm_spec import SPEC as ADD
from kerneltune.kernels.rmsnorm_fwd_spec import SPEC as FWD
from kerneltune.kernels.rmsnorm_quant import QUANT_MODES
from kerneltune.kernels.rmsnorm_quant_spec import SPEC as QUANT

SPECS = pytest.mark.parametrize("spec", [FWD, ADD], ids=lambda s: s.name)


@SPECS
def test_whole_rows_on_a_persistent_grid(spec: KernelSpec) -> None:
    """The default's whole row on 2-4 programs per SM at any M: at few rows one a program, where
    the default packs several; never a looped or split row, nor 64 warps an SM."""
    few = spec.problem(16, 1024)
    default = spec.default(few)
    assert default.ROWS == 2
    persistent = [c for c in spec.candidates(few) if c.GRID_MULT > 1]
    assert persistent[0] == default.replace(GRID_MULT=2, ROWS=1)
    assert {(c.GRID_MULT, c.num_warps, c.ROWS) for c in persistent} == {
        (2, 4, 1), (4, 4, 2), (3, 4, 2), (4, 4, 1), (2, 8, 2), (4, 2, 2)}
    many = spec.problem(4096, 4096)
    default = spec.default(many)
    one_row, *persistent = spec.candidates(many)
    assert [one_row] == spec.one_row_launch(many)
    assert all(c == default.replace(GRID_MULT=c.GRID_MULT, num_warps=c.num_warps)
               for c in persistent)
    assert not spec.valid(many, default.replace(GRID_MULT=4, num_warps=16))  # 64 warps
    looped = default.replace(SINGLE=False, BLOCK_N=1024, num_warps=4)
    assert spec.valid(many, looped) and not spec.valid(many, looped.replace(GRID_MULT=2))
    assert not any(c.GRID_MULT > 1 and not c.COOP
                   for c in spec.candidates(spec.problem(4096, 20000)))


@SPECS
def test_a_search_starts_with_the_one_row_peers_launch(spec: KernelSpec) -> None:
    """The whole row, one row a program, no eviction hint, in the fewest warps from 4 that
    hold it (the forward's released as it exits): first among the candidates, where a
    register block holds the row."""
    release = {"LATE_RELEASE": True} if spec is FWD else {}
    for n, warps in [(1024, 4), (5120, 4), (16384, 8), (32768, 16)]:
        problem = spec.problem(16384, n)
        first = spec.candidates(problem)[0]
        assert first == spec.default(problem).replace(
            BLOCK_N=next_pow2(n), SINGLE=True, ROWS=1, EVICT=False, num_warps=warps,
            num_stages=1, COOP=False, GRID_MULT=1, **release)
        assert spec.valid(problem, first)
    assert spec.one_row_launch(spec.problem(4096, 65536)) == []  # no block holds 64K


@pytest.mark.parametrize(("spec", "options"), [
    *((spec, {"offset": offset}) for spec in (FWD, ADD) for offset in (0.0, 1.0)),
    *((QUANT, {"quant": quant}) for quant in QUANT_MODES)],
    ids=lambda v: v.name if isinstance(v, KernelSpec) else str(v))
@pytest.mark.parametrize("rows", [1, 2])
def test_a_persistent_grid_works_through_every_row_block(spec: KernelSpec, options: dict,
                                                         rows: int, device: str) -> None:
    """More row blocks than programs (the interpreter's few SMs): each program loops, loading
    its next block ahead, and the last blocks are partial; quant's row may be two blocks. A
    looped row is refused."""
    m = 2 * rows * 3 * sm_count(device) + 5  # two row blocks a program, and a partial one
    problem = spec.problem(m, 1000, "float16", **options)
    config = spec.default(problem).replace(ROWS=rows, GRID_MULT=3)
    assert spec.valid(problem, config)
    inputs = spec.make_inputs(problem, seed=11, device=device)
    assert spec.check(inputs, spec.run(inputs, config)) is None
    if spec is QUANT:  # 512 + 488 columns
        two_blocks = config.replace(PARTS=2, BLOCK_N=512)
        assert spec.check(inputs, spec.run(inputs, two_blocks)) is None
    with pytest.raises(ValueError, match="persistent grid"):
        spec.run(inputs, config.replace(ROWS=1, SINGLE=False, BLOCK_N=512))
