"""`kerneltune report` turns a table and a benchmark result into markdown and plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kerneltune import report
from kerneltune import table as tbl
from kerneltune.cli import app

ROOT = Path(__file__).resolve().parents[1]


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
    summary = "| rmsnorm_fwd | bfloat16 | 6 | 1.10x / 1.10x / 1.10x | 0.70 (2048 x 4096) | 0.70 |"
    assert summary in md
    assert md.count("| rmsnorm_fwd | bfloat16 |") == 1 + 6  # the summary, then each entry
    png = tmp_path / "r" / "rmsnorm_fwd-bfloat16.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_kernel_summary_holds_each_kernel_against_copy_at_large_m() -> None:
    def entry(kernel: str, n: int, m: int, speedup: float, frac: float | None) -> tbl.Entry:
        return tbl.Entry(kernel, "bfloat16", n, m, {"BLOCK_N": 1024}, us=10.0, gbps=1.0,
                         default_us=10.0 * speedup, trials=8, kernel_hash="abc", frac_copy=frac)

    table = tbl.Table("NVIDIA H200", tbl.Env(triton="3.6.0"), 4300.0, [
        entry("rmsnorm_fwd", 2048, 4096, 1.0, 0.9), entry("rmsnorm_fwd", 5120, 4096, 1.3, 0.6),
        entry("rmsnorm_fwd", 8192, 16384, 1.1, 0.8),
        entry("rmsnorm_fwd", 5120, 2048, 1.0, 0.1),  # below M = 4096: not held against copy
        entry("rmsnorm_bwd", 4096, 1, 1.05, None),
    ])
    assert report.kernel_summary(table) == [
        "| rmsnorm_bwd | bfloat16 | 1 | 1.05x / 1.05x / 1.05x | - | - |",
        "| rmsnorm_fwd | bfloat16 | 4 | 1.05x / 1.00x / 1.30x | 0.60 (5120 x 4096) | 0.80 |",
    ]
    assert report.kernel_summary(table)[1] in report.markdown(table)


def test_report_rejects_a_bad_table(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": 99}')
    result = CliRunner().invoke(app, ["report", str(bad)])
    assert result.exit_code == 2
    assert "unsupported schema" in result.output


def _bench_rows() -> list[dict]:
    """Three shapes: kerneltune ahead of both peers at 4096 x 4096, behind liger at
    4096 x 16384 (where its eager calls, 36 µs, beat its 40 µs graph: a timing to check); at
    16 x 4096 far from copy (not counted: small M) and its default faster than its tuned config
    (the tuned one is what the runtime runs, so it is what counts)."""
    small = {"kernel": "rmsnorm_bwd", "m": 16, "n": 4096, "dtype": "bfloat16", "options": {}}
    rows = [{**small, "impl": "kerneltune", "gpu_us": 2.0, "gbps": 100.0, "frac_copy": 0.05,
             "frac_copy_same_bytes": 0.4},
            {**small, "impl": "kerneltune-default", "gpu_us": 1.8, "gbps": 110.0,
             "frac_copy": 0.06, "frac_copy_same_bytes": 0.45},
            {**small, "impl": "liger", "gpu_us": 2.1, "gbps": 95.0}]
    for (m, n), ours_us, frac, same in (((4096, 4096), 10.0, 0.80, 0.90),
                                         ((4096, 16384), 40.0, 0.60, 0.62)):
        shape = {"kernel": "rmsnorm_bwd", "m": m, "n": n, "dtype": "bfloat16", "options": {}}
        rows += [
            {**shape, "impl": "copy (same bytes)", "gpu_us": ours_us * same, "gbps": 1.0},
            {**shape, "impl": "kerneltune", "gpu_us": ours_us, "gbps": 3000.0,
             "frac_copy": frac, "frac_copy_same_bytes": same,
             "eager_us": 30.0 if n == 4096 else 36.0},
            {**shape, "impl": "kerneltune-default", "gpu_us": ours_us * 1.1, "gbps": 2700.0},
            {**shape, "impl": "liger", "gpu_us": ours_us * (1.3 if n == 4096 else 0.95),
             "gbps": 2000.0},
            {**shape, "impl": "torch.compile", "error": "out of memory"},
        ]
    return rows


def test_bench_summary_names_the_worst_shapes() -> None:
    worst = report.worst_shapes(_bench_rows())
    assert worst["shapes"] == 3
    assert worst["frac_copy"] == (0.60, (4096, 16384))
    assert worst["frac_copy_same_bytes"] == (0.62, (4096, 16384))
    assert worst["ratio_to_fastest_peer"] == (pytest.approx(0.95), (4096, 16384), "liger")
    assert [(shape, impl) for shape, impl, _ in worst["behind"]] == [((4096, 16384), "liger")]


def test_a_kerneltune_row_faster_in_eager_calls_than_in_its_graph_is_flagged() -> None:
    rows = _bench_rows()
    assert [(r["m"], r["n"]) for r in report.timing_suspects(rows)] == [(4096, 16384)]
    md = report.bench_markdown({"device": "NVIDIA H200", "rows": rows})
    assert ("**Timing to check:** at 1 kerneltune rows the eager time per call is more than 3% "
            "and 2 µs below the GPU time") in md
    assert "rmsnorm_bwd kerneltune 4096 x 16384 (40.0 against 36.0 µs)" in md
    # Within what a dependent launch's overlap between eager calls explains: not flagged.
    overlapped = [{**r, "eager_us": 37.0} if r.get("eager_us") == 36.0 else r for r in rows]
    assert report.timing_suspects(overlapped) == []
    for r in rows:
        r.pop("eager_us", None)
    assert "Timing to check" not in report.bench_markdown({"device": "NVIDIA H200",
                                                           "rows": rows})


def test_the_committed_h100_suite_has_no_timing_to_check() -> None:
    """Graphs are captured before the float64 check, so no row's eager time beats its GPU
    time beyond what a dependent launch's overlap explains."""
    suite = ROOT / "benchmarks" / "results" / "nvidia-h100-80gb-hbm3" / "suite.json"
    assert report.timing_suspects(report.load_bench(suite)["rows"]) == []


def test_report_of_a_table_and_a_benchmark(tmp_path) -> None:
    path = tbl.save(_table(), tmp_path / "t.json")
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"device": "NVIDIA H200", "env": {"triton": "3.6.0"},
                                 "copy_gbps": 4262.0, "rows": _bench_rows()}))
    result = CliRunner().invoke(app, ["report", str(path), "--bench", str(bench)])
    assert result.exit_code == 0, result.output
    md = (tmp_path / "README.md").read_text()
    assert "# kerneltune table: NVIDIA H200" in md and "# kerneltune benchmark" in md
    assert "| rmsnorm_bwd | 3 | 0.60 (4096 x 16384) | 0.62 (4096 x 16384) | " \
           "0.95 (4096 x 16384, liger) | 1 |" in md
    assert "| 16 | 4096 | 2.00 | 100 | 0.05 | 0.40 | 1.80 | nan | 1.05 | - |" in md
    assert ("| 4096 | 4096 | 10.00 | 3000 | 0.80 | 0.90 | 11.00 | 30.0 | 1.30 | out of memory |"
            in md)
    for png in ("rmsnorm_fwd-bfloat16.png", "rmsnorm_bwd.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_of_a_committed_benchmark_alone(tmp_path) -> None:
    bench = ROOT / "benchmarks" / "results" / "nvidia-h200" / "suite.json"
    result = CliRunner().invoke(app, ["report", "--bench", str(bench), "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    md = (tmp_path / "README.md").read_text()
    assert "kerneltune table" not in md
    # 5 kernels and quant modes x 2 M x 13 N shapes
    assert md.count("\n| 4096 | ") + md.count("\n| 16384 | ") == 130
    assert (tmp_path / "rmsnorm_bwd.png").stat().st_size > 5000


def test_report_needs_something_to_report(tmp_path) -> None:
    assert CliRunner().invoke(app, ["report"]).exit_code == 2
    bad = tmp_path / "bench.json"
    bad.write_text("[]")
    result = CliRunner().invoke(app, ["report", "--bench", str(bad)],
                                env={"COLUMNS": "300"})  # the message on one line
    assert result.exit_code == 2 and "not a benchmark result" in result.output
