"""Does it matter on how many SMs a row's chunks lie? The shipped split numbers its programs
lane-major (program (lane, q) = divmod(pid, Q)), and consecutive programs go to different SMs:
a row's Q chunks lie on Q SMs, and a step waits for the slowest of them. `chunk_major` numbers
them (q, lane) = divmod(pid, P) instead: where the grid's first wave places program pid on the
SM of pid mod SMs (P · Q = GRID_MULT · SMs), a row's chunks lie on Q / GRID_MULT SMs, GRID_MULT
chunks on each. Outputs compared with the shipped split's (the same values: only the
numbering changes), then timed, for quant and the forward.

    PYTHONPATH=src python benchmarks/results/nvidia-h100-80gb-hbm3/quant-split/placement.py \
        out.json [MxN,...]
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

import slack as harness

from kerneltune.env import device_name, environment
from kerneltune.kernels import REGISTRY
from kerneltune.table import load as load_table
from kerneltune.table import m_bucket
from kerneltune.tuner.timing import copy_bandwidth_gbps, graph_time, rotation_count

LANE_CHUNK = '''

@triton.jit
def lane_chunk_chunk_major(NQ, N, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    n_lanes = tl.num_programs(0) // NQ
    q = pid // n_lanes
    cols = q * BLOCK_N + tl.arange(0, BLOCK_N)
    return pid % n_lanes, n_lanes, q, cols, cols < N
'''
CALL = "lane, n_lanes, q, cols, col_ok = lane_chunk(NQ, N, BLOCK_N)"
KERNELS = {"rmsnorm_quant_fwd": "_rmsnorm_quant_coop_kernel",
           "rmsnorm_fwd": "_rmsnorm_fwd_coop_kernel"}


def chunk_major(kernel: str) -> str:
    text = Path(REGISTRY[kernel].kernel_module.__file__).read_text()
    anchor = f"\n\n@triton.jit\ndef {KERNELS[kernel]}("
    if text.count(CALL) != 1 or text.count(anchor) != 1:
        raise SystemExit(f"{kernel}: source text not found once")
    text = text.replace(anchor, LANE_CHUNK + anchor)
    return text.replace(CALL, CALL.replace("lane_chunk(", "lane_chunk_chunk_major("))


def load(text: str, name: str, folder: Path):
    path = folder / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def call(module, xs, w, config, mode: str):
    """Call i of `module`'s kernel (quant in `mode`, or the forward where mode is "")."""
    if mode:
        return lambda i: module.rmsnorm_quant_fwd(xs[i], w, None, 1e-6, mode, config)
    return lambda i: module.rmsnorm_fwd(xs[i], w, 1e-6, 0.0, config)


def main() -> None:
    out = Path(sys.argv[1])
    shapes = (sys.argv[2].split(",") if len(sys.argv) > 2 else
              ["4096x65536", "4096x262144", "4096x32768", "16384x65536", "2048x131072"])
    table = load_table(Path("src/kerneltune/tables/nvidia-h100-80gb-hbm3.json")).index()
    copy = copy_bandwidth_gbps("cuda")
    result = {"device": device_name(), "env": environment().__dict__, "copy_gbps": copy,
              "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        chunk_major_modules = {kernel: load(chunk_major(kernel), f"{kernel}_chunk_major",
                                            Path(tmp)) for kernel in KERNELS}
        for shape in shapes:
            m, n = map(int, shape.split("x"))
            sets = rotation_count(3 * m * n)
            xs, w = harness.inputs(m, n, sets)
            for kernel in KERNELS:
                spec = REGISTRY[kernel]
                config = spec.normalize(spec.problem(m, n, "bfloat16"),
                                        table[(kernel, "bfloat16", n, m_bucket(m))].config)
                if not config["COOP"]:
                    continue
                for mode in (("int8", "fp8") if kernel == "rmsnorm_quant_fwd" else ("",)):
                    calls = {name: call(module, xs, w, config, mode) for name, module in (
                        ("shipped", REGISTRY[kernel].kernel_module),
                        ("chunk_major", chunk_major_modules[kernel]))}
                    ref = calls["shipped"](0)
                    row = {"kernel": kernel, "m": m, "n": n, "mode": mode, "config": config,
                           "us": {}, "differ": {}}
                    for name, call in calls.items():
                        got = call(0)
                        row["differ"][name] = int(sum(
                            (a.view(torch.uint8) != b.view(torch.uint8)).sum()
                            for a, b in zip(got, ref, strict=True)))
                        row["us"][name] = graph_time(call, sets).median_us
                    result["rows"].append(row)
                    print(shape, kernel, mode, {k: round(v, 1) for k, v in row["us"].items()},
                          row["differ"], flush=True)
            del xs
            torch.cuda.empty_cache()
            out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
