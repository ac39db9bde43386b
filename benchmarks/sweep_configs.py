"""Time a sample of a kernel's valid configs on a few shapes: where the best ones lie.

    PYTHONPATH=src python benchmarks/sweep_configs.py --kernel rmsnorm_fwd \
        --shapes 16384x4096,4096x65536 --max-configs 80 --out sweep.json
    PYTHONPATH=src python benchmarks/sweep_configs.py --kernel rmsnorm_bwd --only DW=split \
        --shapes 4096x65536 --out split.json
    PYTHONPATH=src python benchmarks/sweep_configs.py --kernel rmsnorm_quant_fwd \
        --configs picked.json --shapes 4096x65536 --out picked-timed.json
    PYTHONPATH=src python benchmarks/sweep_configs.py --kernel rmsnorm_quant_fwd \
        --option quant=fp8 --shapes 4096x5120 --max-configs 60 --out fp8.json
    PYTHONPATH=src python benchmarks/sweep_configs.py --kernel rmsnorm_fwd \
        --configs variants.json --base src/kerneltune/tables/nvidia-h100-80gb-hbm3.json \
        --shapes 4096x4096 --out variants-timed.json

Each config's output is checked against the float64 reference before it is timed.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from kerneltune.env import device_name, environment, on_gpu
from kerneltune.kernels import REGISTRY, KernelConfig, KernelSpec, Problem
from kerneltune.table import Config, Table, m_bucket
from kerneltune.table import load as load_table
from kerneltune.tuner.timing import capture_config, copy_bandwidth_gbps, rotating_inputs


def completed(spec: KernelSpec, problem: Problem, partial: list[Config],
              table: Table | None) -> list[KernelConfig]:
    """The `partial` configs (JSON maps of some parameters), each completed from the table's
    pick for the problem's key (its M bucket), or from the default where there is no table or
    no entry. A parameter the kernel does not have, or a value of the wrong type, is an error;
    whether a completed config may run on the problem is the caller's to ask."""
    key = (spec.name, problem.dtype, problem.n, m_bucket(problem.m))
    entry = table.index().get(key) if table is not None else None
    base = spec.default(problem) if entry is None else spec.parse(problem, entry.config)
    return [spec.config_type.from_json({**base.to_json(), **c}) for c in partial]


def problem_options(spec: KernelSpec, items: list[str]) -> dict[str, Any]:
    """`--option` KEY=VALUE items as the kernel's option values; a name it does not take, or a
    value it does not allow, is an error that lists what it does (a typo must not time the
    default silently)."""
    options: dict[str, Any] = {}
    for item in items:
        name, _, text = item.partition("=")
        if name not in spec.options:
            raise ValueError(f"--option {item!r}: {spec.name} takes "
                             f"{', '.join(spec.options) or 'no options'}")
        allowed = spec.options[name]
        value = next((v for v in allowed if str(v) == text), None)
        if value is None:
            raise ValueError(f"--option {item!r}: {name} is one of "
                             f"{', '.join(map(str, allowed))}")
        options[name] = value
    return options


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", default="rmsnorm_fwd")
    ap.add_argument("--shapes", required=True, help="MxN,MxN,...")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="a problem option, as the kernel names it (repeatable), e.g. quant=fp8")
    ap.add_argument("--max-configs", type=int, default=80)
    ap.add_argument("--seconds", type=float, default=60.0, help="time budget per shape")
    ap.add_argument("--only", action="append", default=[], metavar="KEY=VALUE",
                    help="keep the configs with this value (repeatable; the default is timed too)")
    ap.add_argument("--configs", type=Path, default=None,
                    help="JSON list of configs to time (partial: the rest from the default) "
                         "instead of a sample of the space")
    ap.add_argument("--base", type=Path, default=None, metavar="TABLE",
                    help="with --configs: complete each given config from this table's pick "
                         "for the key (an empty one times the pick) rather than the default")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    only = dict(item.split("=", 1) for item in args.only)
    spec = REGISTRY[args.kernel]
    try:
        options = problem_options(spec, args.option)
    except ValueError as e:
        ap.error(str(e))
    unknown = sorted(set(only) - set(spec.config_type.field_types()))
    if unknown:  # a typo must not filter every config out
        ap.error(f"--only {', '.join(unknown)}: {spec.name}'s parameters are "
                 f"{', '.join(spec.config_type.field_types())}")
    device = "cuda" if on_gpu() else "cpu"
    copy = copy_bandwidth_gbps(device)
    table = load_table(args.base) if args.base else None
    out = {"device": device_name(), "env": environment().__dict__, "copy_gbps": copy,
           "options": options, "shapes": []}
    for shape in args.shapes.split(","):
        m, n = map(int, shape.split("x"))
        problem = spec.problem(m, n, args.dtype, **options)
        default = spec.default(problem)
        if args.configs:
            given = completed(spec, problem, json.loads(args.configs.read_text()), table)
            configs = [c for c in given if spec.rejects(problem, c) is None]
            if len(configs) < len(given):
                print(f"{m}x{n}: {len(given) - len(configs)} given configs are not valid there")
        else:
            configs = list(spec.configs(problem))
            random.Random(0).shuffle(configs)
        configs = [c for c in configs if all(str(getattr(c, k)) == v for k, v in only.items())]
        configs = list(dict.fromkeys(configs))  # each config once, in order
        configs = [default, *[c for c in configs if c != default][:args.max_configs - 1]]
        sets = (rotating_inputs(spec, problem, device=device) if device == "cuda"
                else [spec.make_inputs(problem, 0, device)])
        rows, t_end = [], time.monotonic() + args.seconds
        for config in configs:
            if time.monotonic() > t_end:
                break
            row: dict[str, Any] = {"config": config.to_json()}
            try:
                timed = capture_config(spec, problem, config, device=device, input_sets=sets,
                                       budget_ms=25)
                why = spec.check(sets[0], spec.run(sets[0], config))
                if why:
                    rows.append({**row, "error": f"wrong output: {why[:200]}"})
                    continue
                t = timed()
                gbps = spec.bytes_moved(problem) / (t.median_us * 1e-6) / 1e9
                rows.append({**row, "us": t.median_us, "gbps": gbps})
            except Exception as e:
                rows.append({**row, "error": str(e).splitlines()[0][:200]})
        ok = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])
        d_us = next((r["us"] for r in rows if r["config"] == default.to_json() and "us" in r),
                    None)
        print(f"\n{args.kernel} {m}x{n}: {len(rows)} configs, default "
              + (f"{d_us:.2f} us ({spec.bytes_moved(problem) / d_us / 1e3:.0f} GB/s)"
                 if d_us else "failed"))
        for r in ok[:5]:
            frac = f"{r['gbps'] / copy:5.2f}" if copy else "     "
            print(f"  {r['us']:9.2f} us {r['gbps']:7.0f} GB/s {frac}  {r['config']}")
        if ok:
            print(f"  worst {ok[-1]['us']:.2f} us; errors {sum('error' in r for r in rows)}")
        out["shapes"].append({"m": m, "n": n, "default": default.to_json(), "rows": rows})
        del sets
        if device == "cuda":
            torch.cuda.empty_cache()
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
