"""A `benchmarks/bench_kernels.py` result as markdown and PNG plots.

Per kernel (and quant mode): GB/s against N, one panel per M, one line per implementation, with
the device's copy bandwidth as the ceiling (as the Triton layer-norm tutorial's chart); a table
per shape of kerneltune's time, its fractions of copy, and each peer's time against it; and a
summary of the worst shapes: the lowest fraction of copy at M >= 4096 and the lowest ratio to
the fastest peer.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from kerneltune.report._figure import pyplot, save

#: The row the benchmark adds per shape: a copy of the kernel's bytes, the ceiling there.
COPY = "copy (same bytes)"
OURS = ("kerneltune", "kerneltune-default")
#: (colour, line style, width) per implementation: kerneltune in red, each peer its own colour.
STYLE = {"kerneltune": ("C3", "-", 2.4), "kerneltune-default": ("C3", ":", 1.6),
         "F.rms_norm": ("C0", "-", 1.2), "F.layer_norm": ("C0", "-", 1.2),
         "liger": ("C1", "-", 1.2), "quack": ("C9", "-", 1.2), "vllm": ("C8", "-", 1.2),
         "torch-eager": ("C2", "-", 1.2), "torch.compile": ("C4", "-", 1.2),
         "triton one-row": ("C5", "-", 1.2), COPY: ("k", ":", 1.0)}
#: Slower than the fastest peer by more than this counts as behind (timing noise).
NOISE = 0.02
#: Fewest rows for a shape's fraction of copy to count: below, launch latency, not bandwidth,
#: bounds every implementation.
LARGE_M = 4096
#: Eager calls add host time to the same launches a graph replays, so a kerneltune row whose
#: eager time is more than this below its GPU time had its graph timed slow (as when graphs were
#: captured after the float64 check).
GRAPH_SLACK = 0.03
#: ... and more than this many µs besides: back-to-back eager calls of a programmatic dependent
#: launch place each kernel while the one before it finishes, which the first launch of each
#: replay cannot, and a multi-GB shape's graph holds one or two launches; the overlap seen there
#: stays well within this margin.
LAUNCH_OVERLAP_US = 2.0

Result = dict[str, Any]
Row = dict[str, Any]


class BenchError(ValueError):
    """Not a benchmark result."""


def load_bench(path: Path) -> Result:
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BenchError(f"{path}: not a benchmark result ({e})") from e
    if not isinstance(result, dict) or not isinstance(result.get("rows"), list) \
            or "device" not in result:
        raise BenchError(f"{path}: not a benchmark result (no device and rows)")
    return result


def bench_groups(rows: list[Row]) -> dict[str, list[Row]]:
    """Rows by kernel and options, in the order first seen: 'rmsnorm_quant_fwd-int8',
    'rmsnorm_group_quant_fwd-128-fp8' (the options' values in the order of their names, so
    rows that list them in another order still fall in one group)."""
    out: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        opts = "-".join(str(v) for _, v in sorted(r.get("options", {}).items()))
        out[r["kernel"] + (f"-{opts}" if opts else "")].append(r)
    return dict(out)


def _shapes(rows: list[Row]) -> dict[tuple[int, int], dict[str, Row]]:
    shapes: dict[tuple[int, int], dict[str, Row]] = defaultdict(dict)
    for r in rows:
        shapes[(r["m"], r["n"])][r["impl"]] = r
    return dict(sorted(shapes.items()))


def _ours(by: dict[str, Row]) -> Row | None:
    """kerneltune's measurement of a shape: the tuned config's where the table has one (what
    the runtime runs, even where the default timed faster), else the default's."""
    return next((by[k] for k in OURS if "gpu_us" in by.get(k, {})), None)


def _fastest_peer(by: dict[str, Row]) -> Row | None:
    peers = [r for k, r in by.items() if k not in (*OURS, COPY) and "gpu_us" in r]
    return min(peers, key=lambda r: r["gpu_us"]) if peers else None


def plot_bench(result: Result, out_dir: Path) -> list[Path]:
    plt = pyplot()
    paths = []
    copy = result.get("copy_gbps")
    for name, rows in bench_groups(result["rows"]).items():
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
            ax.set(title=f"M = {m}", xlabel="N", ylabel="GB/s")
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(ms):]:
            ax.axis("off")
        axes.flat[0].legend(fontsize=7)
        paths.append(save(fig, f"{name}, {rows[0]['dtype']} on {result['device']} "
                          "(GPU time, CUDA-graph replay)", out_dir / f"{name}.png"))
    return paths


def worst_shapes(rows: list[Row]) -> dict[str, Any]:
    """Over the shapes of one kernel: kerneltune's lowest fraction of copy (of the peak and of
    a same-bytes copy) at M >= LARGE_M and its lowest ratio of the fastest peer's time to its
    own at any M, each with its shape (M, N), and the shapes where it is behind the fastest
    peer beyond noise."""
    shapes = [(shape, _ours(by), _fastest_peer(by)) for shape, by in _shapes(rows).items()]
    timed = [(shape, ours, peer) for shape, ours, peer in shapes if ours is not None]
    out: dict[str, Any] = {"shapes": len(timed)}
    for key in ("frac_copy", "frac_copy_same_bytes"):
        have = [(ours[key], shape) for shape, ours, _ in timed
                if key in ours and shape[0] >= LARGE_M]
        out[key] = min(have) if have else None
    ratios = [(peer["gpu_us"] / ours["gpu_us"], shape, peer["impl"])
              for shape, ours, peer in timed if peer is not None]
    out["ratio_to_fastest_peer"] = min(ratios) if ratios else None
    out["behind"] = [(shape, impl, ratio) for ratio, shape, impl in ratios if ratio < 1 - NOISE]
    return out


def timing_suspects(rows: list[Row]) -> list[Row]:
    """kerneltune's rows whose eager time per call is more than GRAPH_SLACK and
    LAUNCH_OVERLAP_US below their GPU time: their GPU time is not to be trusted."""
    return [r for r in rows if r["impl"] in OURS and "gpu_us" in r and r.get("eager_us")
            and r["eager_us"] < (1 - GRAPH_SLACK) * r["gpu_us"] - LAUNCH_OVERLAP_US]


def bench_markdown(result: Result, images: list[Path] | None = None) -> str:
    env = ", ".join(f"{k} {v}" for k, v in (result.get("env") or {}).items() if v)
    lines = [f"# kerneltune benchmark: {result['device']}", "",
             f"{env}; copy bandwidth {result.get('copy_gbps')} GB/s. GPU time: CUDA-graph "
             "replay over rotating inputs; ratio: peer GPU time / kerneltune's (> 1: kerneltune "
             "is faster); of copy: against the peak copy bandwidth; of same-bytes copy: against "
             "a copy of the kernel's bytes timed alike (the ceiling at that size).", "",
             f"| kernel | shapes | lowest of copy at M >= {LARGE_M} (M x N) | "
             f"lowest of same-bytes copy at M >= {LARGE_M} (M x N) | "
             "lowest ratio to the fastest peer (M x N, peer) | behind a peer |",
             "|---|---|---|---|---|---|"]
    groups = bench_groups(result["rows"])

    def at(value: tuple | None, digits: int = 2) -> str:
        return "-" if value is None else f"{value[0]:.{digits}f} ({value[1][0]} x {value[1][1]})"

    for name, rows in groups.items():
        w = worst_shapes(rows)
        ratio = w["ratio_to_fastest_peer"]
        lines.append(f"| {name} | {w['shapes']} | {at(w['frac_copy'])} | "
                     f"{at(w['frac_copy_same_bytes'])} | "
                     + ("-" if ratio is None else
                        f"{ratio[0]:.2f} ({ratio[1][0]} x {ratio[1][1]}, {ratio[2]})")
                     + f" | {len(w['behind'])} |")
    lines.append("")
    suspects = timing_suspects(result["rows"])
    if suspects:
        listed = ", ".join(f"{r['kernel']} {r['impl']} {r['m']} x {r['n']} ({r['gpu_us']:.1f} "
                           f"against {r['eager_us']:.1f} µs)" for r in suspects[:8])
        more = f" and {len(suspects) - 8} more" if len(suspects) > 8 else ""
        lines += [f"**Timing to check:** at {len(suspects)} kerneltune rows the eager time per "
                  f"call is more than {GRAPH_SLACK:.0%} and {LAUNCH_OVERLAP_US:g} µs below the "
                  f"GPU time, which eager calls of the same launches cannot be: "
                  f"{listed}{more}.", ""]
    for image in images or []:
        lines += [f"![{image.stem}]({image.name})", ""]
    for name, rows in groups.items():
        impls = sorted({r["impl"] for r in rows} - {*OURS, COPY})
        lines += [f"## {name}", "",
                  "| M | N | kerneltune µs | GB/s | of copy | of same-bytes copy | default µs | "
                  "eager µs | " + " | ".join(f"{p} ratio" for p in impls) + " |",
                  "|---" * (8 + len(impls)) + "|"]
        for (m, n), by in _shapes(rows).items():
            ours = _ours(by)
            if ours is None:
                continue
            ratios = [f"{by[p]['gpu_us'] / ours['gpu_us']:.2f}" if "gpu_us" in by.get(p, {})
                      else by.get(p, {}).get("error", "-")[:20] for p in impls]
            default = by.get("kerneltune-default", {})
            lines.append(
                f"| {m} | {n} | {ours['gpu_us']:.2f} | {ours['gbps']:.0f} | "
                f"{ours.get('frac_copy', math.nan):.2f} | "
                f"{ours.get('frac_copy_same_bytes', math.nan):.2f} | "
                f"{default.get('gpu_us', math.nan):.2f} | "
                f"{ours.get('eager_us', math.nan):.1f} | " + " | ".join(ratios) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"
