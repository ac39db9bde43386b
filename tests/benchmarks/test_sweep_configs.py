"""`sweep_configs.py`: the configs a probe gives are completed from the table's pick (`--base`);
`--option` takes only the options and values the kernel declares."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kerneltune.kernels.rmsnorm_bwd_spec import SPEC as BWD
from kerneltune.kernels.rmsnorm_fwd_spec import SPEC
from kerneltune.kernels.rmsnorm_quant_spec import SPEC as QUANT
from kerneltune.table import Entry, Table

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from sweep_configs import completed, problem_options


def test_given_configs_complete_the_pick_of_the_problems_m_bucket() -> None:
    pick = {**SPEC.default(SPEC.problem(4096, 2048)), "num_warps": 8, "EVICT": False}
    table = Table("NVIDIA H100 80GB HBM3", entries=[
        Entry("rmsnorm_fwd", "bfloat16", n=2048, m=4096, config=pick, us=25.0, gbps=2700.0,
              default_us=26.0, trials=8, kernel_hash="hash")])
    problem = SPEC.problem(3000, 2048)  # bucket 4096
    assert completed(SPEC, problem, [{}, {"GRID_MULT": 3}], table) == [
        pick, {**pick, "GRID_MULT": 3}]
    other = SPEC.problem(2048, 4096)  # no entry for that key: the default
    assert completed(SPEC, other, [{"GRID_MULT": 2}], table) == [
        {**SPEC.default(other), "GRID_MULT": 2}]
    assert completed(SPEC, problem, [{}], None) == [SPEC.default(problem)]


def test_options_are_the_kernels_own_values() -> None:
    assert problem_options(QUANT, ["quant=fp8"]) == {"quant": "fp8"}
    assert problem_options(BWD, ["offset=1.0"]) == {"offset": 1.0}  # the declared value, a float
    assert problem_options(QUANT, []) == {}


@pytest.mark.parametrize(("spec", "item", "says"), [
    (QUANT, "qaunt=fp8", "takes quant"),
    (QUANT, "quant=fp9", "quant is one of int8, fp8, fake"),
    (QUANT, "quant", "quant is one of"),
    (SPEC, "quant=fp8", "rmsnorm_fwd takes offset"),
])
def test_an_option_the_kernel_does_not_take_is_an_error(spec, item, says) -> None:
    with pytest.raises(ValueError, match=says):
        problem_options(spec, [item])
