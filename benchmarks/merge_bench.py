"""Merge results of `bench_kernels.py` taken on one GPU model: where two files hold a shape, the
later file's rows for it replace the earlier's, so every shape's implementations still come from
one process (timed side by side). Each row and process names the file it came from, as given
on the command line (and, for a part that is itself a merge, the file inside it); a suite
merged into itself (a part that is --out) keeps the names its rows have.

    python benchmarks/merge_bench.py first.json remeasured.json --out suite.json [--kernels K,...]

--kernels keeps those kernels' rows only (a suite of one kernel out of a run of all four).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench_kernels import shape_key
from result_files import write_json

Result = dict[str, Any]


def _source(name: str, item: dict[str, Any], own: bool = False) -> str:
    """Where a row or process came from: the part's name, followed by the file it came from
    inside the part where the part is itself a merge (so that the shards of two merged runs,
    each named shard-0.json, stay apart); for the merge's own output merged into again (`own`),
    the name the item already has."""
    inner = item.get("source")
    if own and inner:
        return inner
    return f"{name}:{inner}" if inner else name


def merge(parts: list[tuple[str, Result]], kernels: set[str] | None = None,
          into: str | None = None) -> Result:
    """The parts' rows, each shape from the last part that measured it; of `kernels` only,
    where given. The part named `into` (the output, merged into again) keeps its rows' and
    processes' sources."""
    if not parts:
        raise ValueError("nothing to merge")
    devices = {r["device"] for _, r in parts}
    if len(devices) > 1:
        raise ValueError(f"results from different devices: {', '.join(sorted(devices))}")
    shapes: dict[tuple, list[dict[str, Any]]] = {}
    for name, result in parts:
        measured: dict[tuple, list[dict[str, Any]]] = {}
        for row in result["rows"]:
            if kernels is not None and row["kernel"] not in kernels:
                continue
            key = shape_key(row["kernel"], row["options"], row["m"], row["n"])
            measured.setdefault(key, []).append({**row, "source": _source(name, row,
                                                                           name == into)})
        shapes.update(measured)  # a re-measured shape keeps its old place, with the new rows
    last = parts[-1][1]
    return {**{k: v for k, v in last.items() if k not in ("rows", "processes")},
            "processes": [{**p, "source": _source(name, p, name == into)}
                          for name, r in parts for p in r.get("processes", [])],
            "rows": [row for rows in shapes.values() for row in rows]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("parts", nargs="+", type=Path, help="results, earliest first")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--kernels", help="comma-separated: keep these kernels' rows only")
    args = ap.parse_args()
    kernels = set(args.kernels.split(",")) if args.kernels else None
    into = next((str(p) for p in args.parts if p.resolve() == args.out.resolve()), None)
    merged = merge([(str(p), json.loads(p.read_text())) for p in args.parts], kernels, into)
    write_json(args.out, merged)
    print(f"{args.out}: {len(merged['rows'])} rows from {len(args.parts)} results")


if __name__ == "__main__":
    main()
