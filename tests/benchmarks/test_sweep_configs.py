"""`sweep_configs.py --base`: the configs a probe gives are completed from the table's pick."""

from __future__ import annotations

import sys
from pathlib import Path

from kerneltune.kernels.rmsnorm_fwd_spec import SPEC
from kerneltune.table import Entry, Table

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from sweep_configs import completed


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
