"""A tuned table as a markdown summary and PNG plots.

Per kernel and dtype: GB/s against N (one line per M bucket), tuned against default, with the
device's copy bandwidth as the ceiling; and a table of every entry with its fraction of copy
bandwidth and speedup over the default config.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from kerneltune import table as tbl
from kerneltune.report._figure import pyplot, save


def _default_gbps(e: tbl.Entry) -> float:
    """GB/s of the default config: the tuned entry's bytes over the default's time."""
    return e.gbps * e.us / e.default_us if e.default_us > 0 else math.nan


def _lines(ax: Any, entries: list[tbl.Entry], x: str, series: str, copy_gbps: float | None
           ) -> None:
    """GB/s against `x` ("n" or "m"), one tuned (solid) and one default (dotted) line per value
    of `series`, on a log2 axis, with the copy bandwidth and a fraction-of-copy axis."""
    groups: dict[int, list[tbl.Entry]] = defaultdict(list)
    for e in entries:
        groups[getattr(e, series)].append(e)
    # A sequential colour map (short of its pale yellow end): the 17 M buckets would repeat a
    # 10-colour cycle, and neighbouring sizes read best in neighbouring shades.
    colors = pyplot().get_cmap("viridis")
    for i, (value, es) in enumerate(sorted(groups.items())):
        es.sort(key=lambda e: getattr(e, x))
        xs, color = [getattr(e, x) for e in es], colors(0.9 * i / max(1, len(groups) - 1))
        ax.plot(xs, [e.gbps for e in es], "-o", ms=3, color=color,
                label=f"{series.upper()}={value}")
        ax.plot(xs, [_default_gbps(e) for e in es], ":", color=color)
    if copy_gbps:
        ax.axhline(copy_gbps, color="k", ls="--", lw=0.8, label="copy bandwidth")
        ax.secondary_yaxis("right", functions=(lambda g: g / copy_gbps,
                                               lambda f: f * copy_gbps)).set_ylabel("of copy")
    ax.set_xscale("log", base=2)
    ax.set(xlabel=x.upper(), ylabel="GB/s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2 if len(groups) > 8 else 1)


def _by_kernel(table: tbl.Table) -> list[tuple[tuple[str, str], list[tbl.Entry]]]:
    """The table's entries grouped by (kernel, dtype), in that order."""
    groups: dict[tuple[str, str], list[tbl.Entry]] = defaultdict(list)
    for e in table.entries:
        groups[(e.kernel, e.dtype)].append(e)
    return sorted(groups.items())


def plot(table: tbl.Table, out_dir: Path) -> list[Path]:
    """Per kernel and dtype: GB/s against N (a line per M bucket) and against M (a line per N),
    tuned solid, default dotted."""
    plt = pyplot()
    paths = []
    for (kernel, dtype), entries in _by_kernel(table):
        fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
        _lines(axes[0], entries, "n", "m", table.copy_gbps)
        _lines(axes[1], entries, "m", "n", table.copy_gbps)
        paths.append(save(fig, f"{kernel} {dtype} on {table.device} (tuned solid, default "
                          "dotted)", out_dir / f"{kernel}-{dtype}.png"))
    return paths


#: Rows from which a kernel is held against the copy bandwidth: below, launch and tail latency
#: weigh in and even a copy of the same bytes stays far from the peak.
LARGE_M = 4096


def kernel_summary(table: tbl.Table) -> list[str]:
    """Markdown rows, one per kernel and dtype: keys, tuned over default (median, worst, best),
    and at M >= `LARGE_M` the worst and median fraction of copy bandwidth."""
    rows = []
    for (kernel, dtype), entries in _by_kernel(table):
        speedups = sorted(e.speedup for e in entries if math.isfinite(e.speedup))
        ratios = "-"
        if speedups:
            ratios = (f"{statistics.median(speedups):.2f}x / {speedups[0]:.2f}x / "
                      f"{speedups[-1]:.2f}x")
        large = sorted((e.frac_copy, e.n, e.m) for e in entries
                       if e.m >= LARGE_M and e.frac_copy is not None)
        copy = "- | -"
        if large:
            worst, n, m = large[0]
            copy = f"{worst:.2f} ({n} x {m}) | {statistics.median(f for f, _, _ in large):.2f}"
        rows.append(f"| {kernel} | {dtype} | {len(entries)} | {ratios} | {copy} |")
    return rows


def markdown(table: tbl.Table, images: list[Path] | None = None) -> str:
    env = ", ".join(f"{k} {v}" for k, v in table.env.__dict__.items() if v)
    speedups = [e.speedup for e in table.entries if math.isfinite(e.speedup)]
    lines = [f"# kerneltune table: {table.device}", "",
             f"{len(table.entries)} entries; {env}; copy bandwidth "
             + (f"{table.copy_gbps:.0f} GB/s." if table.copy_gbps else "not measured."), ""]
    if speedups:
        lines += [f"Tuned over default: median {statistics.median(speedups):.3f}x, "
                  f"worst {min(speedups):.3f}x, best {max(speedups):.3f}x.", ""]
    lines += ["| kernel | dtype | keys | tuned over default: median / worst / best "
              f"| of copy at M >= {LARGE_M}: worst (N x M) | median |",
              "|---|---|---|---|---|---|", *kernel_summary(table), ""]
    for image in images or []:
        lines += [f"![{image.stem}]({image.name})", ""]
    lines += ["| kernel | dtype | N | M | µs | GB/s | of copy | default µs | speedup | trials "
              "| config |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in table.sorted().entries:
        frac = f"{e.frac_copy:.2f}" if e.frac_copy is not None else "-"
        config = " ".join(f"{k}={v}" for k, v in e.config.items())
        lines.append(f"| {e.kernel} | {e.dtype} | {e.n} | {e.m} | {e.us:.2f} | {e.gbps:.0f} | "
                     f"{frac} | {e.default_us:.2f} | {e.speedup:.3f} | {e.trials} | {config} |")
    return "\n".join(lines) + "\n"
