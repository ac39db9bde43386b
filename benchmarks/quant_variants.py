"""Quant's kernel timed beside copies of its module changed by source text: what a piece of its
device code costs, at the table's config (and any other), with the forward beside it.

    PYTHONPATH=src python benchmarks/quant_variants.py TABLE OUT.json \
        [--variants shipped,no_max,...] [--shapes 4096x1024,...] [--configs extra.json] \
        [--shard I/K]

Variants of `kerneltune/kernels/rmsnorm_quant.py`:
- `shipped`: as is;
- `no_round`: y = w · x · r in fp32, never rounded to x's dtype (no bf16 packing and unpacking);
- `no_max`: a row's max|y| taken as 1 (no reduction over y, nothing published for it);
- `light`: both;
- `late_release`: a whole row's program releases the next grid as it exits, not before its
  stores (the forward's LATE_RELEASE);
- `no_pdl`: as shipped, launched the ordinary way.
Only `shipped`, `late_release` and `no_pdl` compute the right values, and only theirs are
checked; the others are timing only. `--configs` is a JSON list of partial configs, each
completed from the table's pick and timed too where valid.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from kerneltune.env import device_name, environment
from kerneltune.kernels import REGISTRY
from kerneltune.table import load as load_table
from kerneltune.table import m_bucket
from kerneltune.tuner.timing import copy_bandwidth_gbps, graph_time, rotation_count

SOURCE = Path(REGISTRY["rmsnorm_quant_fwd"].kernel_module.__file__).read_text()
NO_ROUND = [('''    y = w[None, :] * _cast(xhat, DTYPE, SOFT_ROUND).to(tl.float32)
    return _cast(y, DTYPE, SOFT_ROUND).to(tl.float32)''', "    return w[None, :] * xhat")]
# r has a row's shape at every site; x * 0 is not folded away (NaN), so no reduction is left.
NO_MAX = [("amax = tl.maximum(amax, tl.max(tl.abs(yt), axis=1))", "amax = amax"),
          ("amax = tl.maximum(amax, tl.abs(y))", "amax = amax"),
          ("tl.max(tl.abs(y), axis=1)", "(r * 0.0 + 1.0)")]
LATE_RELEASE = [("""            release_next_grid(PDL)
            scale, mul = _row_scale(amax, eps, min_scale, MODE, QMAX)""",
                 "            scale, mul = _row_scale(amax, eps, min_scale, MODE, QMAX)"),
                ("""                         mask_t, X_LAYOUT, dtype)
        else:""", """                         mask_t, X_LAYOUT, dtype)
            release_next_grid(PDL)
        else:""")]
VARIANTS = {"shipped": [], "no_round": NO_ROUND, "no_max": NO_MAX, "light": NO_ROUND + NO_MAX,
            "late_release": LATE_RELEASE, "no_pdl": []}
CORRECT = ("shipped", "late_release", "no_pdl")
SHAPES = "4096x1024,4096x5120,4096x14336,16384x5120,16384x8192,4096x32768,16384x65536,4096x262144"


def variant(name: str, folder: Path) -> ModuleType:
    text = SOURCE
    for old, new in VARIANTS[name]:
        if old not in text:
            raise SystemExit(f"{name}: source text not found: {old!r}")
        text = text.replace(old, new)
    path = folder / f"quant_{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"quant_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def time_shape(m: int, n: int, configs: list[dict[str, Any]], modules: dict[str, ModuleType],
               table: dict, copy: float) -> dict[str, Any]:
    """Every variant at every config of one shape, both modes, and the forward at its pick."""
    quant, fwd = REGISTRY["rmsnorm_quant_fwd"], REGISTRY["rmsnorm_fwd"]
    g = torch.Generator(device="cuda").manual_seed(0)
    sets = rotation_count(3 * m * n)
    xs = [torch.randn(m, n, device="cuda", generator=g).bfloat16() for _ in range(sets)]
    w = (1 + 0.25 * torch.randn(n, device="cuda", generator=g)).bfloat16()
    row: dict[str, Any] = {"m": m, "n": n, "configs": configs, "us": {}}
    for c, config in enumerate(configs):
        for mode in ("int8", "fp8"):
            inputs = {"x": xs[0], "weight": w, "bias": None, "eps": 1e-6, "quant": mode}
            for name, module in modules.items():
                pdl = False if name == "no_pdl" else None

                def run(i: int, module=module, mode=mode, config=config, pdl=pdl) -> Any:
                    return module.rmsnorm_quant_fwd(xs[i], w, None, 1e-6, mode, config, pdl)

                if name in CORRECT:
                    bad = quant.check(inputs, run(0))
                    if bad:
                        raise SystemExit(f"{name} at {m} x {n} {mode} {config}: {bad}")
                us = graph_time(run, sets).median_us
                row["us"][f"{c}/{mode}/{name}"] = us
    entry = table[("rmsnorm_fwd", "bfloat16", n, m_bucket(m))]
    fcfg = fwd.normalize(fwd.problem(m, n, "bfloat16"), entry.config)
    row["us"]["rmsnorm_fwd"] = graph_time(lambda i: fwd.run(
        {"x": xs[i], "weight": w, "eps": 1e-6, "offset": 0.0}, fcfg), sets).median_us
    row["fwd_config"] = fcfg
    row["of_copy"] = {k: 3 * m * n / (v * 1e3) / copy for k, v in row["us"].items()
                      if k != "rmsnorm_fwd"}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("table")
    ap.add_argument("out")
    ap.add_argument("--variants", default="shipped,no_round,no_max,light")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--configs", default=None, help="JSON file: partial configs to time too")
    ap.add_argument("--shard", default="0/1", metavar="I/K")
    args = ap.parse_args()
    index, count = map(int, args.shard.split("/"))
    table = load_table(Path(args.table)).index()
    quant = REGISTRY["rmsnorm_quant_fwd"]
    extra = json.loads(Path(args.configs).read_text()) if args.configs else []
    copy = copy_bandwidth_gbps("cuda")
    result = {"device": device_name(), "env": environment().__dict__, "copy_gbps": copy,
              "shapes": []}
    with tempfile.TemporaryDirectory() as tmp:
        modules = {name: variant(name, Path(tmp)) for name in args.variants.split(",")}
        for shape in args.shapes.split(",")[index::count]:
            m, n = map(int, shape.split("x"))
            problem = quant.problem(m, n, "bfloat16")
            pick = quant.normalize(problem, table[(quant.name, "bfloat16", n, m_bucket(m))].config)
            configs = [pick] + [c for c in ({**pick, **e} for e in extra)
                                if c != pick and quant.valid(problem, c)]
            row = time_shape(m, n, configs, modules, table, copy)
            result["shapes"].append(row)
            print(shape, {k: round(v, 2) for k, v in row["us"].items()}, flush=True)
            torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
