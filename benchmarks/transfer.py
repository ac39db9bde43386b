"""Another GPU's tuned picks on this GPU, beside this GPU's own picks and the default.

What a GPU without an entry of its own pays for borrowing another GPU's (the runtime's
`transfer` match, `kerneltune.resolution`): at a sample of the keys both tables hold, the
borrowed config, this GPU's own pick and the kernel's default are timed on this GPU at the key's
M (its bucket), alternately over the same rotating inputs, each checked against the reference
first. A key whose two picks are one config is counted, not timed.

    PYTHONPATH=src python benchmarks/transfer.py \
        --source src/kerneltune/tables/nvidia-h100-80gb-hbm3.json --keys 40 --out transfer.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path
from typing import Any

import torch

from kerneltune.env import device_name, environment, on_gpu
from kerneltune.kernels import REGISTRY, KernelConfig
from kerneltune.resolution import usable_config
from kerneltune.table import Entry, Table, load, shipped_table_path
from kerneltune.tuner.timing import capture_config, rotating_inputs

#: Keys are sampled at most this large: the cost of the run is the largest problems'.
MAX_M, MAX_N = 16384, 65536
#: Rounds of alternating replays; each config's time is its best round's median.
ROUNDS = 3


def sample_keys(own: Table, source: Table, count: int, seed: int = 0
                ) -> tuple[list[tuple[Entry, Entry]], int]:
    """Up to `count` (own entry, source entry) pairs of keys both tables hold whose picks differ,
    spread over the kernels (a seeded sample of each kernel's share), and how many common keys
    had the same pick."""
    theirs = source.index()
    pairs = [(e, theirs[e.key]) for e in own.entries
             if e.key in theirs and e.m <= MAX_M and e.n <= MAX_N]
    same = sum(a.config == b.config for a, b in pairs)
    differ = [(a, b) for a, b in pairs if a.config != b.config]
    rng = random.Random(seed)
    by_kernel: dict[str, list[tuple[Entry, Entry]]] = {}
    for pair in differ:
        by_kernel.setdefault(pair[0].kernel, []).append(pair)
    share = -(-count // max(len(by_kernel), 1))
    chosen = [p for group in by_kernel.values() for p in rng.sample(group, min(share, len(group)))]
    return sorted(chosen, key=lambda p: p[0].key)[:count], same


def time_key(own: Entry, borrowed: Entry, device: str) -> dict[str, Any]:
    """The three configs of a key timed alternately on this GPU (µs), or why one could not run."""
    spec = REGISTRY[own.kernel]
    problem = spec.problem(own.m, own.n, own.dtype)
    configs: dict[str, KernelConfig | None] = {
        "own": usable_config(spec, problem, own.config),
        "borrowed": usable_config(spec, problem, borrowed.config),
        "default": spec.default(problem),
    }
    row: dict[str, Any] = {"kernel": own.kernel, "dtype": own.dtype, "n": own.n, "m": own.m,
                           "configs": {k: c and c.to_json() for k, c in configs.items()}}
    refused = [k for k, c in configs.items() if c is None]
    if refused:
        return {**row, "error": f"not valid here: {', '.join(refused)}"}
    sets = (rotating_inputs(spec, problem, device=device) if device == "cuda"
            else [spec.make_inputs(problem, 0, device)])
    timers = {k: capture_config(spec, problem, c, device=device, input_sets=sets)
              for k, c in configs.items() if c is not None}
    for name, config in configs.items():
        why = spec.check(sets[0], spec.run(sets[0], config))
        if why:
            return {**row, "error": f"{name}: wrong output: {why[:200]}"}
    best = dict.fromkeys(timers, float("inf"))
    for _ in range(ROUNDS):
        for k, timer in timers.items():
            best[k] = min(best[k], timer().median_us)
    del sets, timers
    if device == "cuda":
        torch.cuda.empty_cache()
    return {**row, "us": best, "borrowed_over_own": best["borrowed"] / best["own"],
            "default_over_own": best["default"] / best["own"]}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    timed = [r for r in rows if "us" in r]
    if not timed:
        return {"timed": 0}
    ratios = [r["borrowed_over_own"] for r in timed]
    worst = max(timed, key=lambda r: r["borrowed_over_own"])
    return {
        "timed": len(timed),
        "errors": len(rows) - len(timed),
        "borrowed_over_own_median": statistics.median(ratios),
        "borrowed_over_own_worst": worst["borrowed_over_own"],
        "worst_key": {k: worst[k] for k in ("kernel", "n", "m")},
        "within_2pct": sum(x <= 1.02 for x in ratios),
        "default_over_own_median": statistics.median(r["default_over_own"] for r in timed),
        "borrowed_faster_than_default": sum(r["us"]["borrowed"] < r["us"]["default"]
                                            for r in timed),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, required=True, help="the table borrowed from")
    ap.add_argument("--own", type=Path, default=None,
                    help="this GPU's table (default: the one shipped for it)")
    ap.add_argument("--keys", type=int, default=40)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    device = "cuda" if on_gpu() else "cpu"
    own = load(args.own or shipped_table_path(device_name()))
    source = load(args.source)
    if source.device == own.device:
        ap.error(f"--source is {own.device}'s own table: name another GPU's")
    pairs, same = sample_keys(own, source, args.keys)
    out: dict[str, Any] = {"device": device_name(), "env": environment().__dict__,
                           "own": own.device, "source": source.device,
                           "same_pick_keys": same, "rows": []}
    for a, b in pairs:
        row = time_key(a, b, device)
        out["rows"].append(row)
        print(json.dumps({k: row[k] for k in row if k != "configs"}), flush=True)
        out["summary"] = summary(out["rows"])
        Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out.get("summary", {}), indent=1))


if __name__ == "__main__":
    main()
