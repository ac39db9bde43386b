"""The README's tables from this folder's JSON (`quant_variants.py` output): each shape at the
table's pick (config 0), quant's variants in µs (int8 / fp8) with their fraction of copy, and
what each compiled kernel took.

    python benchmarks/results/nvidia-h200/quant-split-bound/summarize.py
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


def shapes(prefix: str) -> list[tuple[float, dict[str, Any]]]:
    """(copy GB/s, shape row) of every shape in the files `prefix`-*.json, by M then N."""
    rows = [(d["copy_gbps"], r) for f in sorted(HERE.glob(f"{prefix}-*.json"))
            for d in [json.loads(f.read_text())] for r in d["shapes"]]
    return sorted(rows, key=lambda cr: (cr[1]["m"], cr[1]["n"]))


def pick(row: dict[str, Any]) -> str:
    c = row["configs"][0]
    how = "split" if c["COOP"] else "whole" if c["SINGLE"] else "loop"
    grid = f" x{c['GRID_MULT']}" if c.get("GRID_MULT", 1) > 1 else ""
    return f"{how} {c['BLOCK_N']} w{c['num_warps']}{grid} s{c['num_stages']}"


def times(row: dict[str, Any], variant: str, copy: float, config: int = 0) -> str:
    """int8 / fp8 µs of a variant at a config, and int8's fraction of copy (quant's bytes)."""
    us = [row["us"].get(f"{config}/{mode}/{variant}") for mode in ("int8", "fp8")]
    if None in us:
        return "wrong" if f"{config}/int8/{variant}" in row.get("wrong", {}) else "-"
    frac = 3 * row["m"] * row["n"] / (us[0] * 1e3) / copy
    return f"{us[0]:.1f} / {us[1]:.1f} ({frac:.3f})"


def resources(row: dict[str, Any], variant: str, config: int = 0) -> str:
    k = row["compiled"][f"{config}/int8/{variant}"][0]
    return f"{k['regs']} / {k['spilled']} / {k['shared'] // 1024}"


def timed_and_compiled(row: dict[str, Any], variant: str, copy: float, config: int) -> str:
    """`times`, then `resources`: a cell of the per-config tables that show both."""
    return f"{times(row, variant, copy, config)}, {resources(row, variant, config)}"


def main() -> None:
    print("Packed weight multiply, at each shape's pick (µs int8 / fp8, int8 of copy):\n")
    print("| M x N | pick | shipped | packed | forward: shipped / packed |")
    print("|---|---|---|---|---|")
    for copy, r in shapes("packed"):
        fwd = f"{r['fwd_us']['0/shipped']:.1f} / {r['fwd_us']['0/packed']:.1f}"
        print(f"| {r['m']} x {r['n']} | {pick(r)} | {times(r, 'shipped', copy)} | "
              f"{times(r, 'packed', copy)} | {fwd} |")
    variants = ("shipped", "packed", "deep", "free_max")
    print("\nThe split's variants at its pick (µs int8 / fp8, int8 of copy):\n")
    print("| M x N | " + " | ".join(variants) + " |")
    print("|---" * (len(variants) + 1) + "|")
    for copy, r in shapes("split"):
        cells = " | ".join(times(r, v, copy) for v in variants)
        print(f"| {r['m']} x {r['n']} | {cells} |")
    waits = ("shipped", "deep", "free_max", "no_wait")
    per_config("slack", "The waits, with `deep` pipelined (µs int8 / fp8, int8 of copy; "
               "registers / spilled / KiB shared)", waits,
               timed_and_compiled)
    per_config("ablate", "What the max costs (µs int8 / fp8, int8 of copy)",
               ("shipped", "free_max", "no_wait", "no_max_at_all"),
               times, forward_at)
    per_config("split", "Registers a thread / bytes spilled / KiB of shared memory (int8)",
               variants, lambda r, v, copy, i: resources(r, v, i))
    per_config("onered", "One reduction a step (µs int8 / fp8, int8 of copy; registers / "
               "spilled / KiB shared)", ("shipped", "one_reduction", "no_max_at_all"),
               timed_and_compiled)
    per_config("order", "This row's max before the row before's store (µs int8 / fp8, int8 of "
               "copy; registers / spilled / KiB shared)",
               ("shipped", "max_first", "packed", "max_first_packed"),
               timed_and_compiled)
    per_config("one-warp", "Twelve one-warp programs an SM beside the pick (µs int8 / fp8, int8 of "
               "copy; registers / spilled / KiB shared)", ("shipped", "packed", "no_max_at_all"),
               timed_and_compiled)


def config_name(c: dict[str, Any]) -> str:
    return f"{c['BLOCK_N']} w{c['num_warps']} x{c['GRID_MULT']} s{c['num_stages']}"


def forward_at(row: dict[str, Any], config: int) -> str:
    """The forward, shipped / no_wait, at the split of quant's config `config`."""
    c = row["configs"][config]
    f = next(j for j, f in enumerate(row["fwd_configs"]) if config_name(f) == config_name(c))
    return f"{row['fwd_us'][f'{f}/shipped']:.1f} / {row['fwd_us'][f'{f}/no_wait']:.1f}"


def per_config(prefix: str, title: str, variants: tuple[str, ...],
               cell: Callable[[dict[str, Any], str, float, int], str],
               forward: Callable[[dict[str, Any], int], str] | None = None) -> None:
    """A table of the split shapes of `prefix`-*.json, a row per config, a column per variant
    (and the forward's shipped / no_wait at the same split, where given)."""
    print(f"\n{title}, per config:\n")
    extra = " forward: shipped / no_wait |" if forward else ""
    print("| M x N | config | " + " | ".join(variants) + " |" + extra)
    print("|---" * (len(variants) + 2 + bool(forward)) + "|")
    for copy, r in shapes(prefix):
        if not r["configs"][0]["COOP"]:
            continue
        for i, c in enumerate(r["configs"]):
            cells = " | ".join(cell(r, v, copy, i) for v in variants)
            tail = f" {forward(r, i)} |" if forward else ""
            print(f"| {r['m']} x {r['n']} | {config_name(c)} | {cells} |{tail}")


if __name__ == "__main__":
    main()
