"""Does the tuner's timing condition pick another config than a model's would?

The tuner allocates a kernel's outputs in each call of the captured graph, so each call writes
the block the call before it freed, and outputs the L2 holds stay there
(`copy_ceiling.py`). In a model the block a norm writes has usually left the L2 by the time
the norm runs again. This takes, per shape, the fastest distinct configs a tuning store's
searches measured for its key (on any kernel code, still valid today), with the table's
pick, and times each both ways in one process: outputs freed each call (the tuner's way) and
every call's outputs kept alive (each call writing memory of its own). It reports the fastest
config of each condition and how much slower than it the table's pick is.

    PYTHONPATH=src:benchmarks python benchmarks/outputs_ranking.py STORE.db TABLE OUT.json \
        --shapes rmsnorm_fwd:4096x1024,rmsnorm_quant_fwd:4096x1024 [--top 6]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import optuna
import torch

from copy_ceiling import both_ways, parse_shapes
from kerneltune.env import device_name, environment
from kerneltune.kernels import REGISTRY
from kerneltune.table import Config, m_bucket
from kerneltune.table import load as load_table
from kerneltune.tuner.job import TuneKey
from kerneltune.tuner.search import fastest_measured
from kerneltune.tuner.timing import copy_bandwidth_gbps, rotating_inputs
from sweep_configs import completed


def rank_shape(kernel: str, m: int, n: int, configs: list[Config], copy_gbps: float
               ) -> dict[str, Any]:
    """Every config of one shape (the table's pick first) timed both ways; the fastest of each
    condition, and how much slower than it the pick is in each."""
    spec = REGISTRY[kernel]
    options = {"quant": "int8"} if "quant" in spec.options else {}
    problem = spec.problem(m, n, "bfloat16", **options)
    sets = rotating_inputs(spec, problem, device="cuda")
    nbytes = spec.bytes_moved(problem)
    rows = []
    for config in configs:
        bad = spec.check(sets[0], spec.run(sets[0], config))
        if bad:
            raise SystemExit(f"{kernel} {m}x{n} {config}: {bad}")
        rows.append({"config": config, **both_ways(spec, sets, config, nbytes, copy_gbps)})
    result: dict[str, Any] = {"kernel": kernel, "m": m, "n": n, "bytes": nbytes, "rows": rows}
    for way in ("freed", "kept"):
        fastest = min(range(len(rows)), key=lambda i: rows[i][way]["gpu_us"])
        result[f"fastest_{way}"] = fastest
        # 1: the pick is the fastest config in this condition; 1.05: 5% slower than it
        result[f"pick_{way}_cost"] = round(rows[0][way]["gpu_us"]
                                           / rows[fastest][way]["gpu_us"], 4)
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store", type=Path, help="a tuning store (SQLite file) of this GPU")
    ap.add_argument("table", type=Path, help="the tuned table of this GPU")
    ap.add_argument("out", type=Path)
    ap.add_argument("--shapes", required=True, help="KERNEL:MxN,...")
    ap.add_argument("--top", type=int, default=6, help="searched configs per shape")
    args = ap.parse_args(argv)
    shapes = parse_shapes(args.shapes)
    table = load_table(args.table)
    studies = optuna.storages.RDBStorage(f"sqlite:///{args.store.resolve()}")
    device = device_name(torch.device("cuda"))
    if device != table.device:
        raise SystemExit(f"the table is of {table.device}, this is {device}")
    copy = copy_bandwidth_gbps("cuda")
    assert copy is not None
    results = []
    for kernel, m, n in shapes:
        spec = REGISTRY[kernel]
        options = {"quant": "int8"} if "quant" in spec.options else {}
        problem = spec.problem(m, n, "bfloat16", **options)
        [pick] = completed(spec, problem, [{}], table)
        key = TuneKey(device, kernel, "bfloat16", n, m_bucket(m))
        configs = [pick] + [c for c, _ in fastest_measured(studies, key, spec, args.top)
                            if c != pick]
        r = rank_shape(kernel, m, n, configs, copy)
        results.append(r)
        rows = r["rows"]
        print(f"{kernel} {m}x{n}: pick {rows[0]['freed']['gpu_us']:.2f} / "
              f"{rows[0]['kept']['gpu_us']:.2f} µs (freed / kept), "
              f"{r['pick_freed_cost']:.3f}x / {r['pick_kept_cost']:.3f}x the fastest of "
              f"{len(rows)} (#{r['fastest_freed']} / #{r['fastest_kept']})", flush=True)
        data = {"device": device, "env": environment().__dict__,
                "date": time.strftime("%Y-%m-%d"), "copy_gbps": round(copy, 1),
                "note": "config 0 of each shape is the table's pick", "shapes": results}
        args.out.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
