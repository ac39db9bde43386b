"""Is quant issue-bound on an H200? Its kernels at the table's configs beside copies with less
arithmetic (wrong values, timing only), and the forward at its own table config.

    PYTHONPATH=src python benchmarks/results/nvidia-h200/quant-issue/probe.py TABLE OUT.json \
        [--shapes 4096x1024,...] [--shard I/K]

Variants of `kerneltune/kernels/rmsnorm_quant.py`, made by replacing source text:
- `shipped`: as is;
- `no_round`: y = w · x · r in fp32, never rounded to x's dtype (no bf16 packing and unpacking);
- `no_max`: a row's max|y| taken as 1 (no reduction over y, nothing published for it);
- `light`: both.
Only `shipped` computes the right values. The H100's probe of the same question is
`../../nvidia-h100-80gb-hbm3/quant-issue/`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
from pathlib import Path

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
VARIANTS = {"shipped": [], "no_round": NO_ROUND, "no_max": NO_MAX, "light": NO_ROUND + NO_MAX}
SHAPES = "4096x1024,4096x5120,4096x14336,16384x5120,16384x8192,4096x32768,16384x65536,4096x262144"


def variant(name: str, folder: Path):
    text = SOURCE
    for old, new in VARIANTS[name]:
        if old not in text:
            raise SystemExit(f"{name}: source text not found: {old!r}")
        text = text.replace(old, new)
    path = folder / f"quant_{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"quant_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("table")
    ap.add_argument("out")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--shard", default="0/1")
    args = ap.parse_args()
    index, count = map(int, args.shard.split("/"))
    table = load_table(Path(args.table)).index()
    quant, fwd = REGISTRY["rmsnorm_quant_fwd"], REGISTRY["rmsnorm_fwd"]
    copy = copy_bandwidth_gbps("cuda")
    result = {"device": device_name(), "env": environment().__dict__, "copy_gbps": copy,
              "shapes": []}
    with tempfile.TemporaryDirectory() as tmp:
        modules = {name: variant(name, Path(tmp)) for name in VARIANTS}
        for shape in args.shapes.split(",")[index::count]:
            m, n = map(int, shape.split("x"))
            entry = table[("rmsnorm_quant_fwd", "bfloat16", n, m_bucket(m))]
            config = quant.normalize(quant.problem(m, n, "bfloat16"), entry.config)
            g = torch.Generator(device="cuda").manual_seed(0)
            sets = rotation_count(3 * m * n)
            xs = [torch.randn(m, n, device="cuda", generator=g).bfloat16() for _ in range(sets)]
            w = (1 + 0.25 * torch.randn(n, device="cuda", generator=g)).bfloat16()
            row = {"m": m, "n": n, "config": config, "us": {}}
            for mode in ("int8", "fp8"):
                for name, module in modules.items():
                    t = graph_time(lambda i, module=module, mode=mode, xs=xs, w=w, config=config:
                                   module.rmsnorm_quant_fwd(xs[i], w, None, 1e-6, mode, config),
                                   sets)
                    row["us"][f"{mode}/{name}"] = t.median_us
            fwd_entry = table[("rmsnorm_fwd", "bfloat16", n, m_bucket(m))]
            fcfg = fwd.normalize(fwd.problem(m, n, "bfloat16"), fwd_entry.config)
            t = graph_time(lambda i, xs=xs, w=w, fcfg=fcfg: fwd.run(
                {"x": xs[i], "weight": w, "eps": 1e-6, "offset": 0.0}, fcfg), sets)
            row["us"]["rmsnorm_fwd"] = t.median_us
            row["fwd_config"] = fcfg
            row["of_copy"] = {k: 3 * m * n / (v * 1e3) / copy for k, v in row["us"].items()
                              if k != "rmsnorm_fwd"}
            result["shapes"].append(row)
            print(shape, {k: round(v, 2) for k, v in row["us"].items()}, flush=True)
            del xs
            torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
