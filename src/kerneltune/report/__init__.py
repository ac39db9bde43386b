"""`kerneltune report`: a tuned table and a benchmark result as markdown and PNG plots."""

from __future__ import annotations

from pathlib import Path

from kerneltune import table as tbl
from kerneltune.report._bench import (
    BenchError,
    bench_groups,
    bench_markdown,
    load_bench,
    plot_bench,
    timing_suspects,
    worst_shapes,
)
from kerneltune.report._table import kernel_summary, markdown, plot

__all__ = ["BenchError", "bench_groups", "bench_markdown", "kernel_summary", "load_bench",
           "markdown", "plot", "plot_bench", "timing_suspects", "worst_shapes", "write_report"]


def write_report(out_dir: Path, table_path: Path | None = None, bench_path: Path | None = None
                 ) -> Path:
    """`out_dir`/README.md and the plots beside it: the table's entries, then the benchmark's
    shapes (either may be left out, not both). Raises TableError or BenchError for bad input."""
    if table_path is None and bench_path is None:
        raise ValueError("nothing to report: give a table, a benchmark result, or both")
    table = tbl.load(table_path) if table_path is not None else None
    bench = load_bench(bench_path) if bench_path is not None else None
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = []
    if table is not None:
        parts.append(markdown(table, plot(table, out_dir)))
    if bench is not None:
        parts.append(bench_markdown(bench, plot_bench(bench, out_dir)))
    md = out_dir / "README.md"
    md.write_text("\n".join(parts))
    return md
