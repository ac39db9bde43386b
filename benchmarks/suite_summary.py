"""The results at a glance of a `bench_kernels.py` result (or a merge of several): per kernel
and quant mode, kerneltune's fraction of the copy bandwidth at M >= 4096 and the ratio of the
fastest peer's GPU time to kerneltune's, as a markdown table.

    python benchmarks/suite_summary.py benchmarks/results/nvidia-h200/suite.json [--short]

kerneltune's time at a shape is its tuned config's where the table had one (what the runtime
runs), else its default's, as in `kerneltune report`. A ratio above 1 means kerneltune is
faster; a shape counts as behind where the fastest peer is more than 2% faster. `--short`
gives the three columns the top-level README shows.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from kerneltune.report import bench_groups as groups

COPY = "copy (same bytes)"
OURS = ("kerneltune", "kerneltune-default")
#: Rows from this M on are bound by bandwidth rather than launch latency.
LARGE_M = 4096
#: Slower than the fastest peer by more than this counts as behind (timing noise).
NOISE = 0.02
LABELS = {
    "rmsnorm_fwd": "`rms_norm` forward",
    "rmsnorm_bwd": "`rms_norm` backward (dx, dw)",
    "add_rmsnorm_fwd": "`add_rms_norm`",
    "rmsnorm_quant_fwd-int8": "`rms_norm_quant` int8",
    "rmsnorm_quant_fwd-fp8": "`rms_norm_quant` fp8",
    "layernorm_fwd": "`layer_norm` forward",
    "layernorm_bwd": "`layer_norm` backward (dx, dw, db)",
    "rmsnorm_group_quant_fwd-128-fp8": "`rms_norm_group_quant` fp8, groups of 128",
    "add_rmsnorm_group_quant_fwd-128-fp8": "`add_rms_norm_quant` fp8, groups of 128",
}

Row = dict[str, Any]


def summarize(rows: list[Row]) -> dict[str, Any]:
    """One group's numbers: shapes measured and run by kerneltune; its fraction of copy at
    M >= LARGE_M (median, and the lowest with its shape); the fastest peer's time over its own
    (median, and the lowest with its shape and peer); the shapes where it is behind."""
    shapes: dict[tuple[int, int], dict[str, Row]] = defaultdict(dict)
    for r in rows:
        shapes[(r["m"], r["n"])][r["impl"]] = r
    fracs: list[tuple[float, tuple[int, int]]] = []
    ratios: list[tuple[float, tuple[int, int], str]] = []
    ran = 0
    for shape, by in sorted(shapes.items()):
        ours = next((by[k] for k in OURS if "gpu_us" in by.get(k, {})), None)
        if ours is None:
            continue
        ran += 1
        if shape[0] >= LARGE_M and "frac_copy" in ours:
            fracs.append((ours["frac_copy"], shape))
        peers = [r for k, r in by.items() if k not in (*OURS, COPY) and "gpu_us" in r]
        if peers:
            fastest = min(peers, key=lambda r: r["gpu_us"])
            ratios.append((fastest["gpu_us"] / ours["gpu_us"], shape, fastest["impl"]))
    return {
        "shapes": len(shapes), "ran": ran,
        "frac_median": statistics.median(f for f, _ in fracs) if fracs else None,
        "frac_lowest": min(fracs) if fracs else None,
        "ratio_median": statistics.median(r for r, _, _ in ratios) if ratios else None,
        "ratio_lowest": min(ratios) if ratios else None,
        "behind": sum(r < 1 - NOISE for r, _, _ in ratios),
    }


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(result: dict[str, Any], short: bool = False) -> str:
    """The table, one line per kernel (and quant mode)."""
    if short:
        lines = [f"| kernel | of copy, median at M >= {LARGE_M} | fastest peer / kerneltune: "
                 "median (lowest) |", "|---|---|---|"]
    else:
        lines = [f"| kernel | shapes run | of copy at M >= {LARGE_M}: median | lowest (M x N) "
                 "| fastest peer / kerneltune: median | lowest (M x N, peer) | "
                 f"behind a peer by > {NOISE:.0%} |", "|---|---|---|---|---|---|---|"]
    for name, rows in groups(result["rows"]).items():
        s = summarize(rows)
        label = LABELS.get(name, f"`{name}`")
        frac, ratio = s["frac_lowest"], s["ratio_lowest"]
        if short:
            lines.append(f"| {label} | {_num(s['frac_median'], 2)} | "
                         f"{_num(s['ratio_median'], 2)} ({_num(ratio and ratio[0], 2)}) |")
            continue
        lowest_frac = "-" if frac is None else f"{frac[0]:.2f} ({frac[1][0]} x {frac[1][1]})"
        lowest_ratio = "-" if ratio is None else (
            f"{ratio[0]:.2f} ({ratio[1][0]} x {ratio[1][1]}, {ratio[2]})")
        lines.append(f"| {label} | {s['ran']} of {s['shapes']} | {_num(s['frac_median'], 2)} | "
                     f"{lowest_frac} | {_num(s['ratio_median'], 2)} | {lowest_ratio} | "
                     f"{s['behind']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result", type=Path, help="a bench_kernels.py or merge_bench.py result")
    ap.add_argument("--short", action="store_true", help="three columns")
    args = ap.parse_args(argv)
    print(markdown(json.loads(args.result.read_text()), args.short), end="")


if __name__ == "__main__":
    main()
