# ruff: noqa: E501  (the kernels' source lines it replaces)
"""How far ahead should a cooperative split load? Quant's and the forward's splits timed as
shipped (the block after next loaded a step ahead) beside variants, at several splits.

    PYTHONPATH=src python benchmarks/results/nvidia-h100-80gb-hbm3/coop-depth/probe.py out.json

Variants, made by replacing source text of the kernel modules:
- `shipped`: as is;
- `deep`: one more row block in flight (loaded three steps ahead of its use);
- `late` (quant): the next block's sums of squares published at the end of a step, after this
  block is quantised, so that its load has the whole step to arrive.
Every variant's output is compared with the shipped kernel's (`same`: bit-identical). The
source texts are those of the kernels at commit 72f9cc9, which it ran against.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import torch

from kerneltune.env import device_name, environment
from kerneltune.kernels import REGISTRY
from kerneltune.tuner.timing import copy_bandwidth_gbps, graph_time, rotation_count

QUANT_DEEP = [
    ('''    x_next = load_rows(X, lane + n_lanes, cols, col_ok, stride_x, M, ROWS, EVICT)
    if MODE == 2:''', '''    x_next = load_rows(X, lane + n_lanes, cols, col_ok, stride_x, M, ROWS, EVICT)
    x_next2 = load_rows(X, lane + 2 * n_lanes, cols, col_ok, stride_x, M, ROWS, EVICT)
    if MODE == 2:'''),
    ('''        x_ahead = x_next
        x_next = load_rows(X, rb + 2 * n_lanes, cols, col_ok, stride_x, M, ROWS, EVICT)
        if PHASE <= 1:
            xf = x_ahead.to(tl.float32)''', '''        x_ahead = x_next
        x_next = x_next2
        x_next2 = load_rows(X, rb + 3 * n_lanes, cols, col_ok, stride_x, M, ROWS, EVICT)
        if PHASE <= 1:
            xf = x_ahead.to(tl.float32)''')]
QUANT_LATE = [
    ('''        if PHASE <= 1:
            xf = x_ahead.to(tl.float32)
            publish(PART_SQ, rb + n_lanes, q, NQ, M, tl.sum(xf * xf, axis=1), ROWS)
        if PHASE != 1:''', '''        if PHASE != 1:'''),
    ('''            y_prev = y.to(y_prev.dtype)
        x = x_ahead''', '''            y_prev = y.to(y_prev.dtype)
        if PHASE <= 1:
            xf = x_ahead.to(tl.float32)
            publish(PART_SQ, rb + n_lanes, q, NQ, M, tl.sum(xf * xf, axis=1), ROWS)
        x = x_ahead''')]
FWD_DEEP = [
    ('''    x_next = load_rows(X, lane + n_lanes, cols, col_ok, stride_x, M, ROWS, EVICT)
    for rb in''', '''    x_next = load_rows(X, lane + n_lanes, cols, col_ok, stride_x, M, ROWS, EVICT)
    x_next2 = load_rows(X, lane + 2 * n_lanes, cols, col_ok, stride_x, M, ROWS, EVICT)
    for rb in'''),
    ('''        x_ahead = x_next.to(tl.float32)
        x_next = load_rows(X, rb + 2 * n_lanes, cols, col_ok, stride_x, M, ROWS, EVICT)''',
     '''        x_ahead = x_next.to(tl.float32)
        x_next = x_next2
        x_next2 = load_rows(X, rb + 3 * n_lanes, cols, col_ok, stride_x, M, ROWS, EVICT)''')]
VARIANTS = {"rmsnorm_quant_fwd": {"shipped": [], "deep": QUANT_DEEP, "late": QUANT_LATE},
            "rmsnorm_fwd": {"shipped": [], "deep": FWD_DEEP}}
SHAPES = ["4096x65536", "4096x131072", "4096x262144", "16384x65536", "2048x262144"]
#: (BLOCK_N, ROWS, num_warps, GRID_MULT)
SPLITS = [(16384, 1, 8, 1), (8192, 1, 8, 1), (8192, 2, 8, 1), (8192, 1, 8, 2), (4096, 1, 4, 3),
          (4096, 1, 4, 4)]


def variant(kernel: str, name: str, folder: Path):
    source = Path(REGISTRY[kernel].kernel_module.__file__).read_text()
    for old, new in VARIANTS[kernel][name]:
        if old not in source:
            raise SystemExit(f"{kernel}/{name}: source text not found: {old!r}")
        source = source.replace(old, new)
    path = folder / f"{kernel}_{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"{kernel}_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def launch(kernel: str, module, x, w, config):
    if kernel == "rmsnorm_fwd":
        return module.rmsnorm_fwd(x, w, 1e-6, 0.0, config)
    return module.rmsnorm_quant_fwd(x, w, None, 1e-6, "int8", config)


def main() -> None:
    out_path = Path(sys.argv[1])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shapes = sys.argv[2].split(",") if len(sys.argv) > 2 else SHAPES
    copy = copy_bandwidth_gbps("cuda") if device == "cuda" else None
    result = {"device": device_name(), "env": environment().__dict__, "copy_gbps": copy,
              "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        modules = {(k, name): variant(k, name, Path(tmp))
                   for k in VARIANTS for name in VARIANTS[k]}
        for shape in shapes:
            m, n = map(int, shape.split("x"))
            g = torch.Generator(device=device).manual_seed(0)
            sets = rotation_count(2 * m * n) if device == "cuda" else 1
            xs = [torch.randn(m, n, device=device, generator=g).bfloat16() for _ in range(sets)]
            w = (1 + 0.25 * torch.randn(n, device=device, generator=g)).bfloat16()
            for kernel in VARIANTS:
                spec = REGISTRY[kernel]
                problem = spec.problem(m, n, "bfloat16")
                base = spec.default(problem)
                for block, rows, warps, per_sm in SPLITS:
                    config = {**base, "COOP": True, "SINGLE": False, "EVICT": True,
                              "num_stages": 1, "BLOCK_N": block, "ROWS": rows,
                              "num_warps": warps, "GRID_MULT": per_sm}
                    if not spec.valid(problem, config):
                        continue
                    expected = launch(kernel, modules[(kernel, "shipped")], xs[0], w, config)
                    row = {"kernel": kernel, "m": m, "n": n,
                           "split": [block, rows, warps, per_sm], "us": {}, "same": {}}
                    for (k, name), module in modules.items():
                        if k != kernel:
                            continue
                        got = launch(kernel, module, xs[0], w, config)
                        row["same"][name] = all(torch.equal(a, b)
                                                for a, b in zip(got, expected, strict=True))
                        if device == "cuda":
                            row["us"][name] = graph_time(
                                lambda i, module=module, kernel=kernel, xs=xs, w=w, config=config:
                                launch(kernel, module, xs[i], w, config), sets).median_us
                    bytes_moved = spec.bytes_moved(problem)
                    if copy:
                        row["of_copy"] = {k: bytes_moved / (v * 1e3) / copy
                                          for k, v in row["us"].items()}
                    result["rows"].append(row)
                    print(kernel, shape, row["split"],
                          {k: round(v, 1) for k, v in row["us"].items()}, row["same"], flush=True)
            del xs
            if device == "cuda":
                torch.cuda.empty_cache()
    out_path.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
