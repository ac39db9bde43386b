"""Host time of the backward's split per call, eager (back-to-back calls, no graph): the launch
before runs 460-464 (torch's fill, the split an ordinary launch) beside the shipped one (a
Triton fill, the split a dependent launch), which launches one Triton kernel more.

    PYTHONPATH=src python benchmarks/results/nvidia-h100-80gb-hbm3/bwd-fill/eager.py OUT.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import triton

from kerneltune.env import device_name, environment
from kerneltune.kernels import REGISTRY, _coop
from kerneltune.kernels import rmsnorm_bwd as bwd
from kerneltune.kernels._spec import dependent_launch, sm_count
from kerneltune.table import load as load_table
from kerneltune.table import m_bucket

SPEC = REGISTRY["rmsnorm_bwd"]
TABLE = load_table(Path("src/kerneltune/tables/nvidia-h100-80gb-hbm3.json")).index()
SHAPES = [(1, 65536), (16, 16384), (16, 32768), (256, 16384), (4096, 65536)]
CALLS = 2000


def before(i, config):
    """The split branch of the launcher before runs 460-464."""
    dy, x, weight, rstd = i["dy"], i["x"], i["weight"], i["rstd"]
    m, n = x.shape
    sms = sm_count(x.device)
    pdl = dependent_launch(x.device)
    grid = _coop.lane_count(x, config)
    dx = torch.empty((m, n), dtype=x.dtype, device=x.device)
    dw = torch.empty((n,), dtype=weight.dtype, device=weight.device)
    direct = grid == 1
    partial = dw if direct else torch.empty((grid, n), dtype=torch.float32, device=x.device)
    _coop.launch(bwd._rmsnorm_bwd_split_kernel, x, config, 1, dy, x, weight, rstd, dx, partial,
                 dw, dy.stride(0), x.stride(0), dx.stride(0), m, n, float(i["offset"]),
                 DIRECT=direct, GEMMA=i["offset"] != 0.0, EVICT=config["EVICT"], PDL=pdl,
                 launch_pdl=False)
    if not direct:
        programs, block_c, block_g, warps = bwd.reduce_launch(n, grid, sms)
        bwd._dw_reduce_kernel[(programs,)](partial, dw, grid, n, BLOCK_G=block_g,
                                           BLOCK_C=block_c, num_warps=warps, PDL=pdl,
                                           launch_pdl=pdl)
    return dx, dw


def per_call_us(run, inputs, config) -> float:
    for _ in range(50):
        run(inputs, config)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(CALLS):
        run(inputs, config)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / CALLS * 1e6


def main(out: Path) -> None:
    result = {"device": device_name(), "env": environment().__dict__, "calls": CALLS,
              "triton": triton.__version__, "rows": []}
    for m, n in SHAPES:
        problem = SPEC.problem(m, n, "bfloat16")
        config = SPEC.normalize(problem, TABLE[("rmsnorm_bwd", "bfloat16", n, m_bucket(m))].config)
        inputs = SPEC.make_inputs(problem, seed=0, device="cuda")
        ref = before(inputs, config)
        got = SPEC.run(inputs, config)
        assert torch.equal(ref[0], got[0]) and torch.equal(ref[1], got[1])
        times = {"before": [], "shipped": []}
        for _ in range(3):  # alternated, so drift hits both alike
            times["before"].append(per_call_us(before, inputs, config))
            times["shipped"].append(per_call_us(SPEC.run, inputs, config))
        row = {"m": m, "n": n, "config": config, "us": {k: min(v) for k, v in times.items()},
               "all_us": times}
        result["rows"].append(row)
        print(m, n, {k: round(v, 2) for k, v in row["us"].items()}, flush=True)
        out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
