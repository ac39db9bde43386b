"""`sweep_configs.py`: run as a script under the interpreter it checks and times the default and
a sample of the space, or the configs a probe gives, completed from the table's pick (`--base`);
`--option` takes only the options and values the kernel declares."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kerneltune.kernels.rmsnorm_bwd_spec import SPEC as BWD
from kerneltune.kernels.rmsnorm_fwd_spec import SPEC
from kerneltune.kernels.rmsnorm_quant_spec import SPEC as QUANT
from kerneltune.table import INTERPRETER_DEVICE, Entry, Table
from kerneltune.table import save as save_table

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from sweep_configs import completed, main, problem_options

from .script import run_script


def sweep(*args: str) -> str:
    return run_script("sweep_configs.py", *args).stdout


def test_a_sample_of_the_space_is_checked_and_timed(tmp_path) -> None:
    out = tmp_path / "sweep.json"
    printed = sweep("--kernel", "rmsnorm_quant_fwd", "--option", "quant=fp8", "--dtype",
                    "float32", "--shapes", "3x96,2x200", "--max-configs", "5", "--out", str(out))
    result = json.loads(out.read_text())
    assert result["device"] == INTERPRETER_DEVICE and result["options"] == {"quant": "fp8"}
    assert [(s["m"], s["n"]) for s in result["shapes"]] == [(3, 96), (2, 200)]
    for shape in result["shapes"]:
        problem = QUANT.problem(shape["m"], shape["n"], "float32", quant="fp8")
        configs = [QUANT.parse(problem, row["config"]) for row in shape["rows"]]
        assert configs[0] == QUANT.default(problem) and shape["default"] == configs[0].to_json()
        assert len(set(configs)) == len(configs) == 5
        assert all(QUANT.rejects(problem, c) is None for c in configs)
        assert all(row["us"] > 0 and "error" not in row for row in shape["rows"])
    assert "rmsnorm_quant_fwd 2x200: 5 configs, default" in printed


def test_given_configs_are_completed_from_the_table_and_the_invalid_left_out(tmp_path) -> None:
    problem = SPEC.problem(3, 96, "float32")
    pick = SPEC.default(problem).replace(EVICT=False)
    table = save_table(Table(INTERPRETER_DEVICE, entries=[
        Entry("rmsnorm_fwd", "float32", n=96, m=4, config=pick.to_json(), us=1.0, gbps=1.0,
              default_us=1.0, trials=1, kernel_hash=SPEC.kernel_hash)]), tmp_path / "t.json")
    given = tmp_path / "given.json"
    given.write_text(json.dumps([{}, {"num_warps": 1}, {"BLOCK_N": 16}]))  # 16 cannot hold 96
    out = tmp_path / "given-timed.json"
    printed = sweep("--kernel", "rmsnorm_fwd", "--dtype", "float32", "--shapes", "3x96",
                    "--configs", str(given), "--base", str(table), "--out", str(out))
    assert "3x96: 1 given configs are not valid there" in printed
    (shape,) = json.loads(out.read_text())["shapes"]
    timed = [row["config"] for row in shape["rows"]]
    # the default first, then the pick and the pick in one warp
    assert timed == [SPEC.default(problem).to_json(), pick.to_json(),
                     pick.replace(num_warps=1).to_json()]
    assert all(row["us"] > 0 for row in shape["rows"])


def test_given_configs_complete_the_pick_of_the_problems_m_bucket() -> None:
    pick = SPEC.default(SPEC.problem(4096, 2048)).replace(num_warps=8, EVICT=False)
    table = Table("NVIDIA H100 80GB HBM3", entries=[
        Entry("rmsnorm_fwd", "bfloat16", n=2048, m=4096, config=pick.to_json(), us=25.0,
              gbps=2700.0, default_us=26.0, trials=8, kernel_hash="hash")])
    problem = SPEC.problem(3000, 2048)  # bucket 4096
    assert completed(SPEC, problem, [{}, {"GRID_MULT": 3}], table) == [
        pick, pick.replace(GRID_MULT=3)]
    other = SPEC.problem(2048, 4096)  # no entry for that key: the default
    assert completed(SPEC, other, [{"GRID_MULT": 2}], table) == [
        SPEC.default(other).replace(GRID_MULT=2)]
    assert completed(SPEC, problem, [{}], None) == [SPEC.default(problem)]
    with pytest.raises(ValueError, match="WARPS"):
        completed(SPEC, problem, [{"WARPS": 8}], None)  # a typo is an error, not the default


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


def test_only_names_a_parameter_of_the_kernel(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--kernel", "rmsnorm_fwd", "--shapes", "3x96", "--only", "WARPS=8",
              "--out", str(tmp_path / "out.json")])
    assert stopped.value.code == 2
    assert "--only WARPS: rmsnorm_fwd's parameters are BLOCK_N" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()
