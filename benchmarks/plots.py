"""Plots and a markdown summary of a `bench_kernels.py` result.

One PNG per kernel (and quant mode): GB/s against N, one panel per M, one line per implementation,
with the device's copy bandwidth as the ceiling (as the Triton layer-norm tutorial's chart).

    python benchmarks/plots.py benchmarks/results/nvidia-h200/bench_fwd.json
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

#: The row `bench_kernels.py` adds per shape: a copy of the kernel's bytes, the ceiling there.
COPY = "copy (same bytes)"
#: (colour, line style, width) per implementation: kerneltune in red, each peer its own colour.
STYLE = {"kerneltune": ("C3", "-", 2.4), "kerneltune-default": ("C3", ":", 1.6),
         "F.rms_norm": ("C0", "-", 1.2), "liger": ("C1", "-", 1.2),
         "torch-eager": ("C2", "-", 1.2), "torch.compile": ("C4", "-", 1.2),
         "triton one-row": ("C5", "-", 1.2),
         COPY: ("k", ":", 1.0)}


def _group(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        opts = "-".join(str(v) for v in r.get("options", {}).values())
        out[r["kernel"] + (f"-{opts}" if opts else "")].append(r)
    return out


def plot(result: dict[str, Any], out_dir: Path) -> list[Path]:
    paths = []
    copy = result.get("copy_gbps")
    for name, rows in _group(result["rows"]).items():
        ms = sorted({r["m"] for r in rows})
        cols = min(3, len(ms))
        fig, axes = plt.subplots(math.ceil(len(ms) / cols), cols, squeeze=False,
                                 figsize=(5.2 * cols, 3.8 * math.ceil(len(ms) / cols)))
        for ax, m in zip(axes.flat, ms, strict=False):
            by_impl: dict[str, list[tuple[int, float]]] = defaultdict(list)
            for r in rows:
                if r["m"] == m and "gbps" in r:
                    by_impl[r["impl"]].append((r["n"], r["gbps"]))
            for impl, pts in sorted(by_impl.items()):
                pts.sort()
                color, ls, lw = STYLE.get(impl, (None, "-", 1.2))
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=impl,
                        color=color, linestyle=ls, linewidth=lw)
            if copy:
                ax.axhline(copy, color="k", linestyle="--", linewidth=0.8, label="copy bandwidth")
            ax.set_xscale("log", base=2)
            ax.set_title(f"M = {m}")
            ax.set_xlabel("N")
            ax.set_ylabel("GB/s")
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(ms):]:
            ax.axis("off")
        axes.flat[0].legend(fontsize=7)
        fig.suptitle(f"{name}, {result['rows'][0]['dtype']} on {result['device']} "
                     f"(GPU time, CUDA-graph replay)")
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def summary(result: dict[str, Any]) -> str:
    """Markdown: per shape, kerneltune's time and fraction of copy, and its ratio to each peer."""
    lines = [f"# {result['device']}", "",
             f"copy bandwidth {result.get('copy_gbps')} GB/s; env {result.get('env')}", ""]
    for name, rows in _group(result["rows"]).items():
        impls = sorted({r["impl"] for r in rows} - {"kerneltune", "kerneltune-default", COPY})
        lines += [f"## {name}", "",
                  "| M | N | kerneltune µs | GB/s | of copy | of same-bytes copy | default µs | "
                  "eager µs | " + " | ".join(f"{p} ratio" for p in impls) + " |",
                  "|---" * (8 + len(impls)) + "|"]
        shapes: dict[tuple[int, int], dict[str, dict]] = defaultdict(dict)
        for r in rows:
            shapes[(r["m"], r["n"])][r["impl"]] = r
        for (m, n), by in sorted(shapes.items()):
            ours = by.get("kerneltune") or by.get("kerneltune-default") or {}
            if "gpu_us" not in ours:
                continue
            ratios = [f"{by[p]['gpu_us'] / ours['gpu_us']:.2f}" if "gpu_us" in by.get(p, {})
                      else by.get(p, {}).get("error", "-")[:20] for p in impls]
            d = by.get("kerneltune-default", {})
            lines.append(
                f"| {m} | {n} | {ours['gpu_us']:.2f} | {ours['gbps']:.0f} | "
                f"{ours.get('frac_copy', 0):.2f} | "
                f"{ours.get('frac_copy_same_bytes', float('nan')):.2f} | "
                f"{d.get('gpu_us', float('nan')):.2f} | "
                f"{ours.get('eager_us', float('nan')):.1f} | " + " | ".join(ratios) + " |")
        lines.append("")
    lines.append("Ratio = peer GPU time / kerneltune GPU time (> 1: kerneltune is faster). "
                 "Of copy: against the device's peak copy bandwidth; of same-bytes copy: "
                 "against a copy of the kernel's bytes, timed alike (the ceiling at that size).")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="+")
    args = ap.parse_args()
    for path in map(Path, args.results):
        result = json.loads(path.read_text())
        for p in plot(result, path.parent):
            print(p)
        md = path.with_suffix(".md")
        md.write_text(summary(result))
        print(md)


if __name__ == "__main__":
    main()
