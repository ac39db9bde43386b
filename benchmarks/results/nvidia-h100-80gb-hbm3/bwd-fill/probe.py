"""Is the backward's row split held up by the fill of its flags? The shipped launch (torch
fills the dot slots with UNSET, then the split kernel is launched the ordinary way) beside a
Triton fill that releases the next grid at once, with the split launched ordinarily (`tfill`)
or as a dependent launch placed while the fill runs (`tfill_pdl`). Outputs compared with the
shipped launch's bit for bit, then timed by CUDA-graph replay over rotating inputs, at the
suite shapes whose table pick is a split.

    PYTHONPATH=src python benchmarks/results/nvidia-h100-80gb-hbm3/bwd-fill/probe.py OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from kerneltune.env import device_name, environment
from kerneltune.kernels import REGISTRY, _coop
from kerneltune.kernels import rmsnorm_bwd as bwd
from kerneltune.kernels._dependent_launch import release_next_grid, wait_prior_grid
from kerneltune.kernels._spec import launch_options, next_pow2, sm_count
from kerneltune.table import load as load_table
from kerneltune.table import m_bucket
from kerneltune.tuner.timing import copy_bandwidth_gbps, graph_time, rotating_inputs

SPEC = REGISTRY["rmsnorm_bwd"]
TABLE = load_table(Path("src/kerneltune/tables/nvidia-h100-80gb-hbm3.json")).index()
SHAPES = [(m, n) for m in (1, 16, 256) for n in (14336, 16384, 32768, 65536, 131072, 262144)]
SHAPES += [(2048, 65536), (4096, 65536), (4096, 262144), (16384, 32768)]
FILL_BLOCK = 1024


@triton.jit
def _fill_unset(PART, size, BLOCK: tl.constexpr, PDL: tl.constexpr):
    # The slots may be memory the grid before this one still uses: wait for it first.
    wait_prior_grid(PDL)
    release_next_grid(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(PART + offs, tl.full([BLOCK], -1.0, tl.float32), mask=offs < size)


def variant(dy, x, weight, rstd, offset, config, split_pdl: bool):
    """The shipped launcher's split branch, the flags filled by `_fill_unset`."""
    m, n = x.shape
    sms = sm_count(x.device)
    block, rows = int(config["BLOCK_N"]), int(config["ROWS"])
    chunks = triton.cdiv(n, block)
    assert _coop.phases(chunks, sms, 1) == (0,)
    lanes = _coop.lane_count(x, config)
    dx = torch.empty_like(x)
    dw = torch.empty((n,), dtype=weight.dtype, device=x.device)
    direct = lanes == 1
    partial = dw if direct else torch.empty((lanes, n), dtype=torch.float32, device=x.device)
    dots = torch.empty((m, chunks), dtype=torch.float32, device=x.device)
    _fill_unset[(triton.cdiv(m * chunks, FILL_BLOCK),)](
        dots, m * chunks, BLOCK=FILL_BLOCK, PDL=True, launch_pdl=True, num_warps=4)
    bwd._rmsnorm_bwd_split_kernel[(lanes * chunks,)](
        dots, chunks, dy, x, weight, rstd, dx, partial, dw,
        dy.stride(0), x.stride(0), dx.stride(0), m, n, float(offset),
        BLOCK_N=block, ROWS=rows, NQ_POW2=next_pow2(chunks), PHASE=0, DIRECT=direct,
        GEMMA=offset != 0.0, EVICT=config["EVICT"], PDL=split_pdl, launch_pdl=split_pdl,
        **launch_options(config), **_coop.resident_options(config))
    if not direct:
        programs, block_c, block_g, warps = bwd.reduce_launch(n, lanes, sms)
        bwd._dw_reduce_kernel[(programs,)](partial, dw, lanes, n, BLOCK_G=block_g,
                                           BLOCK_C=block_c, num_warps=warps, PDL=True,
                                           launch_pdl=True)
    return dx, dw


VARIANTS = {
    "shipped": lambda i, c: SPEC.run(i, c),
    "tfill": lambda i, c: variant(i["dy"], i["x"], i["weight"], i["rstd"], i["offset"], c, False),
    "tfill_pdl": lambda i, c: variant(i["dy"], i["x"], i["weight"], i["rstd"], i["offset"], c,
                                      True),
}


def main(out: Path) -> None:
    copy = copy_bandwidth_gbps("cuda")
    result = {"device": device_name(), "env": environment().__dict__, "copy_gbps": copy,
              "rows": []}
    for m, n in SHAPES:
        problem = SPEC.problem(m, n, "bfloat16")
        config = SPEC.normalize(problem, TABLE[("rmsnorm_bwd", "bfloat16", n, m_bucket(m))].config)
        if config["DW"] != "split":
            continue
        sets = rotating_inputs(SPEC, problem, device="cuda")
        ref = VARIANTS["shipped"](sets[0], config)
        row = {"m": m, "n": n, "config": config, "us": {}, "differ": {}}
        for name, run in VARIANTS.items():
            dx, dw = run(sets[0], config)
            row["differ"][name] = int((dx != ref[0]).sum() + (dw != ref[1]).sum())
            t = graph_time(lambda j, run=run, sets=sets, config=config: run(sets[j], config),
                           len(sets))
            row["us"][name] = t.median_us
        result["rows"].append(row)
        print(m, n, {k: round(v, 2) for k, v in row["us"].items()}, row["differ"], flush=True)
        del sets
        torch.cuda.empty_cache()
        out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
