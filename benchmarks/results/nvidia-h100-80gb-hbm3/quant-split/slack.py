"""Does quant's staged split wait for its peers' maxima? The shipped split beside a variant
that gathers a row's maxima two steps after publishing them rather than one; outputs compared
with the shipped split's, then timed.

    PYTHONPATH=src python benchmarks/results/nvidia-h100-80gb-hbm3/quant-split/slack.py \
        time out.json [MxN,...]
    PYTHONPATH=src python .../slack.py once VARIANT KERNEL M N [SPLIT]   # one call, for ncu

In the shipped step of row r a program publishes the next row's sum of squares, then gathers
r's sums with the maxima of r - 1 in one wait. Its peers publish those maxima in the middle of
their step for r - 1, after their own wait, so a peer that is late by part of a step holds up
the whole lane. `slack2` keeps the two rows before r in registers and gathers the maxima of
r - 2 instead, published a whole step earlier. Variants are made by replacing
`_quantise_split_rows` in a copy of `kerneltune/kernels/rmsnorm_quant.py`.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import tempfile
from pathlib import Path

import torch

from kerneltune.env import device_name, environment
from kerneltune.kernels import REGISTRY
from kerneltune.table import load as load_table
from kerneltune.table import m_bucket
from kerneltune.tuner.timing import copy_bandwidth_gbps, graph_time, rotation_count

SOURCE = Path(REGISTRY["rmsnorm_quant_fwd"].kernel_module.__file__).read_text()
SLACK2 = '''def _quantise_split_rows(PART_SQ, PART_MAX, NQ, X, Q, SCALE, stride_x, stride_q, M, N,
                         eps, min_scale, x, w, b, lane, n_lanes, q, cols, col_ok,
                         NQ_POW2: tl.constexpr, PHASE: tl.constexpr, EVICT: tl.constexpr,
                         MODE: tl.constexpr, QMAX: tl.constexpr, HAS_W: tl.constexpr,
                         HAS_B: tl.constexpr, SOFT_ROUND: tl.constexpr, STAGES: tl.constexpr):
    BLOCK_N: tl.constexpr = x.shape[1]
    dtype = X.dtype.element_ty
    if MODE == 2:
        y_prev = tl.zeros([1, BLOCK_N], dtype=tl.float32)
        y_prev2 = tl.zeros([1, BLOCK_N], dtype=tl.float32)
    else:
        y_prev = tl.zeros([1, BLOCK_N], dtype=dtype)
        y_prev2 = tl.zeros([1, BLOCK_N], dtype=dtype)
    for row in tl.range(lane, M, n_lanes, num_stages=STAGES):
        x_ahead = load_rows(X, row + n_lanes, cols, col_ok, stride_x, M, 1, EVICT)
        if PHASE <= 1:
            xf = x_ahead.to(tl.float32)
            publish(PART_SQ, row + n_lanes, q, NQ, M, tl.sum(xf * xf, axis=1), 1)
        if PHASE != 1:
            prev2 = row - 2 * n_lanes
            if PHASE == 2:
                sq_parts = gather_row(PART_SQ, row, NQ, NQ_POW2, False)
                max_prev2 = sq_parts
            else:
                sq_parts, max_prev2 = gather_row_pair(PART_SQ, row, PART_MAX, prev2, NQ,
                                                      NQ_POW2, PHASE == 0)
            r = tl.rsqrt(tl.sum(sq_parts) / N + eps) + tl.zeros([1], dtype=tl.float32)
            y = _normed(x.to(tl.float32), r, w, b, MODE, HAS_W, HAS_B, dtype, SOFT_ROUND)
            if PHASE <= 2:
                publish(PART_MAX, row, q, NQ, M, tl.max(tl.abs(y), axis=1), 1)
            if PHASE != 2:
                _store_row_quantised(Q, SCALE, y_prev2, tl.max(max_prev2), prev2, q, cols,
                                     col_ok, stride_q, M, eps, min_scale, NQ_POW2, MODE, QMAX,
                                     SOFT_ROUND)
            # Not y_prev itself: Triton 3.6's pipeliner leaves a loop alone where an iteration
            # passes on a value it received unchanged (no LDGSTS); a select it cannot fold
            # (lane < n_lanes always holds) hides that.
            y_prev2 = tl.where(lane < n_lanes, y_prev, y_prev2)
            y_prev = y.to(y_prev.dtype)
        x = x_ahead
    if PHASE == 0 or PHASE == 3:
        last = lane + (M - 1 - lane) // n_lanes * n_lanes
        max_last, max_before = gather_row_pair(PART_MAX, last, PART_MAX, last - n_lanes, NQ,
                                               NQ_POW2, PHASE == 0)
        _store_row_quantised(Q, SCALE, y_prev2, tl.max(max_before), last - n_lanes, q, cols,
                             col_ok, stride_q, M, eps, min_scale, NQ_POW2, MODE, QMAX,
                             SOFT_ROUND)
        _store_row_quantised(Q, SCALE, y_prev, tl.max(max_last), last, q, cols, col_ok,
                             stride_q, M, eps, min_scale, NQ_POW2, MODE, QMAX, SOFT_ROUND)


'''
ROWS_FN = re.compile(r"def _quantise_split_rows\(.*?\n\n\n(?=@triton\.jit)", re.S)
VARIANTS = {"shipped": SOURCE, "slack2": ROWS_FN.sub(lambda _: SLACK2, SOURCE, count=1)}
SHAPES = ["4096x65536", "4096x262144", "16384x131072", "4096x32768", "2048x131072"]
#: Splits tried beside the table's: (BLOCK_N, num_warps, GRID_MULT, num_stages), one row
SPLITS = [(4096, 4, 3, 3), (4096, 4, 2, 3), (8192, 8, 1, 3), (8192, 8, 2, 3), (4096, 4, 4, 4)]


def load(name: str, folder: Path):
    if name != "shipped" and VARIANTS[name] == SOURCE:
        raise SystemExit(f"{name}: source text not found")
    path = folder / f"quant_{name}.py"
    path.write_text(VARIANTS[name])
    spec = importlib.util.spec_from_file_location(f"quant_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def configs(m: int, n: int, splits=SPLITS) -> list[dict]:
    quant = REGISTRY["rmsnorm_quant_fwd"]
    problem = quant.problem(m, n, "bfloat16")
    table = load_table(Path("src/kerneltune/tables/nvidia-h100-80gb-hbm3.json")).index()
    found = [quant.normalize(problem, table[("rmsnorm_quant_fwd", "bfloat16", n,
                                             m_bucket(m))].config)]
    for block, warps, per_sm, stages in splits:
        c = quant.normalize(problem, {**found[0], "BLOCK_N": block, "num_warps": warps,
                                      "GRID_MULT": per_sm, "num_stages": stages, "COOP": True,
                                      "SINGLE": False, "ROWS": 1})
        if c not in found:
            found.append(c)
    return found


def inputs(m: int, n: int, sets: int):
    g = torch.Generator(device="cuda").manual_seed(0)
    xs = [torch.randn(m, n, device="cuda", generator=g).bfloat16() for _ in range(sets)]
    return xs, (1 + 0.25 * torch.randn(n, device="cuda", generator=g)).bfloat16()


def timed(out_path: Path, shapes: list[str], names: list[str], splits) -> None:
    copy = copy_bandwidth_gbps("cuda")
    result = {"device": device_name(), "env": environment().__dict__, "copy_gbps": copy,
              "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        modules = {name: load(name, Path(tmp)) for name in names}
        for shape in shapes:
            m, n = map(int, shape.split("x"))
            sets = rotation_count(3 * m * n)
            xs, w = inputs(m, n, sets)
            for i, config in enumerate(configs(m, n, splits)):
                for mode in ("int8", "fp8"):
                    ref = modules["shipped"].rmsnorm_quant_fwd(xs[0], w, None, 1e-6, mode, config)
                    row = {"m": m, "n": n, "mode": mode, "config": config, "table": i == 0,
                           "us": {}, "of_copy": {}, "differ": {}}
                    for name, module in modules.items():
                        q, s = module.rmsnorm_quant_fwd(xs[0], w, None, 1e-6, mode, config)
                        row["differ"][name] = int((q.view(torch.uint8) != ref[0].view(
                            torch.uint8)).sum() + (s != ref[1]).sum())
                        t = graph_time(lambda j, module=module, mode=mode, config=config,
                                       xs=xs, w=w: module.rmsnorm_quant_fwd(
                                           xs[j], w, None, 1e-6, mode, config), sets)
                        row["us"][name] = t.median_us
                        row["of_copy"][name] = 3 * m * n / (t.median_us * 1e3) / copy
                    result["rows"].append(row)
                    print(shape, mode, config, {k: round(v, 1) for k, v in row["us"].items()},
                          row["differ"], flush=True)
            del xs
            torch.cuda.empty_cache()
            out_path.write_text(json.dumps(result, indent=1))


def once(name: str, kernel: str, m: int, n: int, split: str = "") -> None:
    """A warm-up call and one measured call of the table's config, or of the split
    BLOCK_N/num_warps/GRID_MULT/num_stages (ncu: --launch-skip)."""
    xs, w = inputs(m, n, 1)
    if kernel == "rmsnorm_fwd":
        fwd = REGISTRY[kernel]
        table = load_table(Path("src/kerneltune/tables/nvidia-h100-80gb-hbm3.json")).index()
        config = fwd.normalize(fwd.problem(m, n, "bfloat16"),
                               table[(kernel, "bfloat16", n, m_bucket(m))].config)
        for _ in range(2):
            fwd.run({"x": xs[0], "weight": w, "eps": 1e-6, "offset": 0.0}, config)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            module = load(name, Path(tmp))
            for _ in range(2):
                config = configs(m, n, [tuple(map(int, split.split("/")))] if split else [])[-1]
                module.rmsnorm_quant_fwd(xs[0], w, None, 1e-6, "int8", config)
    torch.cuda.synchronize()


if __name__ == "__main__":
    if sys.argv[1] == "time":  # time OUT [SHAPES [VARIANTS [SPLITS]]], comma-separated
        args = [*sys.argv[3:], "", "", ""]
        splits = [tuple(map(int, s.split("/"))) for s in args[2].split(",") if s] or SPLITS
        timed(Path(sys.argv[2]), args[0].split(",") if args[0] else SHAPES,
              args[1].split(",") if args[1] else list(VARIANTS), splits)
    else:
        once(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), *sys.argv[6:7])
