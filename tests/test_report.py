"""`kerneltune report` turns a table into markdown and plots."""

from __future__ import annotations

from typer.testing import CliRunner

from kerneltune import table as tbl
from kerneltune.cli import app


def _table() -> tbl.Table:
    entries = [
        tbl.Entry("rmsnorm_fwd", "bfloat16", n, m, {"BLOCK_N": 1024, "num_warps": 4},
                  us=10.0 * n / 4096, gbps=3000.0, default_us=11.0 * n / 4096, trials=20,
                  kernel_hash="abc", frac_copy=0.7)
        for n in (2048, 4096, 8192) for m in (1, 4096)
    ]
    return tbl.Table("NVIDIA H200", tbl.Env(triton="3.6.0"), 4300.0, entries)


def test_report_writes_markdown_and_plots(tmp_path) -> None:
    path = tbl.save(_table(), tmp_path / "t.json")
    result = CliRunner().invoke(app, ["report", str(path), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    md = (tmp_path / "r" / "README.md").read_text()
    assert "NVIDIA H200" in md and "median 1.100x" in md
    assert md.count("| rmsnorm_fwd | bfloat16 |") == 6
    png = tmp_path / "r" / "rmsnorm_fwd-bfloat16.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_report_rejects_a_bad_table(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": 99}')
    result = CliRunner().invoke(app, ["report", str(bad)])
    assert result.exit_code == 2
    assert "unsupported schema" in result.output
