"""Host overhead of the runtime's eager calls, CUDA-graph capture, and torch.compile without a
graph break, on a GPU, side by side with torch's own op and a bare Triton launch.

    PYTHONPATH=src python benchmarks/bench_runtime.py --out runtime.json
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton

import kerneltune
from kerneltune.env import device_name, environment
from kerneltune.kernels._spec import launch_options
from kerneltune.kernels.rmsnorm_fwd import _rmsnorm_fwd_kernel
from kerneltune.kernels.rmsnorm_fwd_spec import SPEC
from kerneltune.runtime import launch
from kerneltune.runtime.bench import per_call_us
from kerneltune.runtime.resolve import config_for
from kerneltune.tuner.timing import graph_time


def bare_launch(x: torch.Tensor, w: torch.Tensor) -> Any:
    """`kernel[grid](...)` with preallocated outputs: Triton's own launcher and nothing else."""
    m, n = x.shape
    config = SPEC.default(SPEC.problem(m, n, "bfloat16"))
    y, rstd = torch.empty_like(x), torch.empty(m, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(m, config["ROWS"]),)

    def call() -> None:
        _rmsnorm_fwd_kernel[grid](x, w, y, rstd, x.stride(0), y.stride(0), m, n, 1e-6, 0.0,
                                  BLOCK_N=config["BLOCK_N"], ROWS=config["ROWS"],
                                  SINGLE=config["SINGLE"], GEMMA=False, EVICT=config["EVICT"],
                                  PERSIST=False, PDL=False,
                                  LATE_RELEASE=config["LATE_RELEASE"], **launch_options(config))

    return call


def launch_only(x: torch.Tensor, w: torch.Tensor) -> Any:
    """The runtime's launch of its resolved config, without the public function's checks and
    lookup: what the layers above the launch cost is the difference to `kerneltune.rms_norm`."""
    m, n = x.shape
    config = config_for(SPEC, m, n, x.dtype, (("offset", 0.0),))
    plan = launch.RMSNORM_FWD_INFERENCE
    return lambda: launch.launch(plan, config, id(config), x, w, 1e-6, 0.0)


def launch_pieces(x: torch.Tensor, w: torch.Tensor) -> dict[str, Any]:
    """What one fast-path call is made of, timed apart: the output's allocation, and the bound
    launch alone with the output allocated beforehand."""
    m, n = x.shape
    config = config_for(SPEC, m, n, x.dtype, (("offset", 0.0),))
    launch.reset()
    for _ in range(2):  # the first call checks the plan and binds the compiled kernel
        launch.launch(launch.RMSNORM_FWD_INFERENCE, config, id(config), x, w, 1e-6, 0.0)
    (bound,) = launch.RMSNORM_FWD_INFERENCE.compiled.values()
    call = launch.RMSNORM_FWD_INFERENCE.plan(x, w, 1e-6, 0.0, config)
    stream, args = torch.cuda.current_stream().cuda_stream, launch._addresses(call.args)
    return {
        "piece: allocate y": lambda: torch.empty((m, n), dtype=x.dtype, device=x.device),
        "piece: allocate y (empty_like)": lambda: torch.empty_like(x),
        "piece: the call key (call_key)": lambda: launch.call_key("rms_norm inference",
                                                                  (x, w, 1e-6, 0.0)),
        f"piece: bound launch ({bound.__qualname__.split('.')[0]})":
            lambda: bound(call.grid[0], stream, args),
    }


class Block(torch.nn.Module):
    """An HF-style decoder MLP block: norm, gated MLP, residual, norm."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = kerneltune.RMSNorm(n), kerneltune.RMSNorm(n)
        self.up = torch.nn.Linear(n, 2 * n, bias=False)
        self.down = torch.nn.Linear(n, n, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.up(self.norm1(x)).chunk(2, dim=-1)
        return self.norm2(x + self.down(F.silu(a) * b))


def compiled_block(n: int = 4096, m: int = 256) -> dict[str, Any]:
    block = Block(n).cuda().to(torch.bfloat16)
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)  # raises on any graph break
    with torch.inference_mode():
        eager, comp = block(x), compiled(x)
    err = float((comp.float() - eager.float()).norm() / eager.float().norm())
    explain = torch._dynamo.explain(block)(x)
    return {"fullgraph": True, "graph_breaks": explain.graph_break_count,
            "graphs": explain.graph_count, "rel_err_vs_eager": err,
            "compiled_us": graph_time(lambda _: compiled(x), 1).median_us,
            "eager_us_graph": graph_time(lambda _: block(x), 1).median_us}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=4096)
    args = ap.parse_args()
    n, rows = args.n, []
    for m in (1, 64):
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        res = torch.randn_like(x)
        impls = {
            "F.rms_norm": lambda x=x, w=w: F.rms_norm(x, (n,), w, 1e-6),
            "triton bare launch": bare_launch(x, w),
            "kerneltune.rms_norm": lambda x=x, w=w: kerneltune.rms_norm(x, w),
            "kerneltune launch only": launch_only(x, w),
            **launch_pieces(x, w),
            "x + residual, F.rms_norm": lambda x=x, w=w, res=res: F.rms_norm(x + res, (n,), w,
                                                                             1e-6),
            "kerneltune.add_rms_norm": lambda x=x, w=w, res=res: kerneltune.add_rms_norm(x, res,
                                                                                         w),
            "kerneltune.rms_norm_quant": lambda x=x, w=w: kerneltune.rms_norm_quant(x, w),
            "kerneltune.rms_norm_fake_quant": lambda x=x, w=w: kerneltune.rms_norm_fake_quant(
                x, w),
        }
        with torch.inference_mode():
            for name, fn in impls.items():
                row = {"m": m, "n": n, "impl": name, "mode": "inference",
                       "eager_us": per_call_us(fn)}
                if "call key" not in name:  # host work only: nothing for a graph to capture
                    row["graph_us"] = graph_time(lambda _, fn=fn: fn(), 1).median_us
                rows.append(row)
            os.environ[launch.ENV_FAST_LAUNCH] = "0"
            launch.reset()
            slow = per_call_us(impls["kerneltune.rms_norm"])
            rows.append({"m": m, "n": n, "impl": "kerneltune.rms_norm (launcher path)",
                         "mode": "inference", "eager_us": slow})
            del os.environ[launch.ENV_FAST_LAUNCH]
            launch.reset()
        wg = w.clone().requires_grad_()
        rows.append({"m": m, "n": n, "impl": "kerneltune.rms_norm", "mode": "autograd",
                     "eager_us": per_call_us(lambda x=x, wg=wg: kerneltune.rms_norm(x, wg))})
        rows.append({"m": m, "n": n, "impl": "F.rms_norm", "mode": "autograd",
                     "eager_us": per_call_us(lambda x=x, wg=wg: F.rms_norm(x, (n,), wg, 1e-6))})
        rows.append({"m": m, "n": n, "impl": "kerneltune.add_rms_norm", "mode": "autograd",
                     "eager_us": per_call_us(lambda x=x, res=res, wg=wg:
                                             kerneltune.add_rms_norm(x, res, wg))})
        rows.append({"m": m, "n": n, "impl": "x + residual, F.rms_norm", "mode": "autograd",
                     "eager_us": per_call_us(lambda x=x, res=res, wg=wg:
                                             F.rms_norm(x + res, (n,), wg, 1e-6))})
    for r in rows:
        base = next(b for b in rows if b["m"] == r["m"] and b["impl"] == "F.rms_norm"
                    and b["mode"] == r["mode"])
        r["eager_ratio_to_F.rms_norm"] = r["eager_us"] / base["eager_us"]
        print(json.dumps(r))
    result = {"device": device_name(), "env": environment().__dict__,
              "method": "eager: best of 5 x 2000 back-to-back calls; graph: CUDA-graph replay",
              "rows": rows, "compiled_block": compiled_block(n)}
    print(json.dumps(result["compiled_block"]))
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
