"""`kerneltune bench`: the runtime's config for a shape timed against the default, here."""

from __future__ import annotations

from typer.testing import CliRunner

from kerneltune import runtime
from kerneltune import table as tbl
from kerneltune.benchmark import compare
from kerneltune.cli import app
from kerneltune.env import device_name
from kerneltune.kernels import REGISTRY


def test_compare_uses_the_table_named_by_the_environment(tmp_path, monkeypatch) -> None:
    spec = REGISTRY["rmsnorm_fwd"]
    problem = spec.problem(4, 256)
    tuned = next(c for c in spec.configs(problem) if c != spec.default(problem))
    entry = tbl.Entry("rmsnorm_fwd", "bfloat16", 256, 4, tuned.to_json(), 1.0, 1.0, 1.0, 3,
                      spec.kernel_hash)
    path = tbl.save(tbl.Table(device_name(), entries=[entry]), tmp_path / "t.json")
    monkeypatch.setenv("KERNELTUNE_TABLE", str(path))
    runtime.reset()
    try:
        exact, nearest = compare("rmsnorm_fwd", [256], [3, 9])
    finally:
        runtime.reset()
    assert (exact.source, exact.match, exact.config) == ("table", "exact", tuned)
    assert (nearest.source, nearest.match, nearest.m) == ("table", "nearest", 9)  # bucket 16
    assert exact.method == nearest.method == "interpreter"  # never labelled as a GPU's
    assert exact.us > 0 and exact.default_us > 0 and exact.frac_copy is None


def test_bench_command_prints_a_row_per_shape_and_rejects_unknown_kernels() -> None:
    result = CliRunner().invoke(app, ["bench", "-n", "64", "-m", "1", "-m", "5"],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "interpreter timing" in result.output and result.output.count("│ 64 │") == 2
    bad = CliRunner().invoke(app, ["bench", "-k", "nope"])
    assert bad.exit_code == 2 and "unknown kernel" in bad.output
