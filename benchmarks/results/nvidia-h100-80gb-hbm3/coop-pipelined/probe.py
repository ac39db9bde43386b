"""Cooperative splits with their next row blocks loaded by Triton's pipeliner
(`pipe_kernels.py`) beside the shipped splits: outputs compared, then timed.

    PYTHONPATH=src python \
        benchmarks/results/nvidia-h100-80gb-hbm3/coop-pipelined/probe.py out.json [MxN,...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

import pipe_kernels

from kerneltune.env import device_name, environment
from kerneltune.kernels import REGISTRY, _coop
from kerneltune.kernels._spec import interpreting
from kerneltune.kernels.rmsnorm_fwd import rmsnorm_fwd
from kerneltune.kernels.rmsnorm_quant import MODES, quant_dtype, rmsnorm_quant_fwd
from kerneltune.tuner.timing import copy_bandwidth_gbps, graph_time, rotation_count

SHAPES = ["4096x65536", "4096x131072", "4096x262144", "16384x65536", "2048x262144"]
#: (BLOCK_N, num_warps, GRID_MULT), one row a block
SPLITS = [(16384, 8, 1), (8192, 8, 1), (8192, 8, 2), (4096, 4, 3), (4096, 4, 4)]
STAGES = (2, 3, 4)


def fwd_pipe(x, w, config, stages):
    m, n = x.shape
    y = torch.empty_like(x)
    rstd = torch.empty(m, dtype=torch.float32, device=x.device)
    _coop.launch(pipe_kernels.fwd_pipe_kernel, x, {**config, "num_stages": stages}, 1,
                 x, w, y, rstd, x.stride(0), y.stride(0), m, n, 1e-6, 0.0,
                 GEMMA=False, EVICT=True, STAGES=stages)
    return y, rstd


def quant_pipe(x, w, config, stages, quant="int8"):
    m, n = x.shape
    q = torch.empty((m, n), dtype=quant_dtype(quant, x.dtype), device=x.device)
    scale = torch.empty(m, dtype=torch.float32, device=x.device)
    mode, qmax, min_scale = MODES[quant]
    _coop.launch(pipe_kernels.quant_pipe_kernel, x, {**config, "num_stages": stages}, 2,
                 x, w, x, q, scale, x.stride(0), q.stride(0), m, n, 1e-6, min_scale,
                 EVICT=True, MODE=mode, QMAX=qmax, HAS_W=True, HAS_B=False,
                 SOFT_ROUND=interpreting(), STAGES=stages)
    return q, scale


def calls(kernel, xs, w, config):
    """(the shipped split's call of set i, the staged one's of set i with s stages)."""
    if kernel == "rmsnorm_fwd":
        return (lambda i: rmsnorm_fwd(xs[i], w, 1e-6, 0.0, config),
                lambda i, s: fwd_pipe(xs[i], w, config, s))
    return (lambda i: rmsnorm_quant_fwd(xs[i], w, None, 1e-6, "int8", config),
            lambda i, s: quant_pipe(xs[i], w, config, s))


def main() -> None:
    out_path = Path(sys.argv[1])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shapes = sys.argv[2].split(",") if len(sys.argv) > 2 else SHAPES
    copy = copy_bandwidth_gbps("cuda") if device == "cuda" else None
    result = {"device": device_name(), "env": environment().__dict__, "copy_gbps": copy,
              "rows": []}
    for shape in shapes:
        m, n = map(int, shape.split("x"))
        g = torch.Generator(device=device).manual_seed(0)
        sets = rotation_count(2 * m * n) if device == "cuda" else 1
        xs = [torch.randn(m, n, device=device, generator=g).bfloat16() for _ in range(sets)]
        w = (1 + 0.25 * torch.randn(n, device=device, generator=g)).bfloat16()
        for kernel in ("rmsnorm_fwd", "rmsnorm_quant_fwd"):
            spec = REGISTRY[kernel]
            problem = spec.problem(m, n, "bfloat16")
            for block, warps, per_sm in SPLITS:
                config = {**spec.default(problem), "COOP": True, "SINGLE": False, "EVICT": True,
                          "num_stages": 1, "BLOCK_N": block, "ROWS": 1, "num_warps": warps,
                          "GRID_MULT": per_sm}
                if not spec.valid(problem, config):
                    continue
                shipped, piped = calls(kernel, xs, w, config)
                expected = shipped(0)
                row = {"kernel": kernel, "m": m, "n": n, "split": [block, warps, per_sm],
                       "us": {}, "differ": {}}
                for stages in STAGES:
                    got = piped(0, stages)
                    row["differ"][stages] = sum(int((a != b).sum())
                                                for a, b in zip(got, expected, strict=True))
                if device == "cuda":
                    row["us"]["shipped"] = graph_time(shipped, sets).median_us
                    for stages in STAGES:
                        row["us"][f"pipe{stages}"] = graph_time(
                            lambda i, s=stages, piped=piped: piped(i, s), sets).median_us
                    row["of_copy"] = {k: spec.bytes_moved(problem) / (v * 1e3) / copy
                                      for k, v in row["us"].items()}
                result["rows"].append(row)
                print(kernel, shape, row["split"], {k: round(v, 1) for k, v in row["us"].items()},
                      row["differ"], flush=True)
        del xs
        if device == "cuda":
            torch.cuda.empty_cache()
    out_path.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
