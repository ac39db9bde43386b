"""Where an eager training step's host time goes, piece by piece, in one process, the pieces
interleaved round by round (best of 5 rounds of 1000 calls each), then a cProfile of steps.

    PYTHONPATH=src:benchmarks python breakdown.py breakdown.json profile.txt
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import sys

import torch
import torch.nn.functional as F

import kerneltune
from kerneltune.env import device_name, environment
from kerneltune.kernels import rmsnorm_bwd
from kerneltune.kernels.rmsnorm_bwd_spec import SPEC as BWD
from kerneltune.runtime import ops, replay
from kerneltune.runtime.bench import per_call_us
from kerneltune.runtime.resolve import config_for


def pieces(m: int, n: int) -> dict:
    dev, bf16 = "cuda", torch.bfloat16
    x = torch.randn(m, n, device=dev, dtype=bf16, requires_grad=True)
    w = torch.randn(n, device=dev, dtype=bf16, requires_grad=True)
    dy = torch.randn(m, n, device=dev, dtype=bf16)
    xd, wd = x.detach(), w.detach()
    rstd = torch.rsqrt(xd.float().pow(2).mean(-1) + 1e-6)
    cfg = config_for(BWD, m, n, bf16, (("offset", 0.0),))
    grad = torch.autograd.grad
    return {
        "step: kerneltune.rms_norm": lambda: grad(kerneltune.rms_norm(x, w), (x, w), dy),
        "step: custom op": lambda: grad(ops.rms_norm_op(x, w, 1e-6, 0.0)[0], (x, w), dy),
        "step: F.rms_norm": lambda: grad(F.rms_norm(x, (n,), w, 1e-6), (x, w), dy),
        "step: x * 2 (autograd alone)": lambda: grad(x * 2, (x,), dy),
        "forward: kerneltune.rms_norm": lambda: kerneltune.rms_norm(x, w),
        "forward: kerneltune.rms_norm, no grad": lambda: kerneltune.rms_norm(xd, wd),
        "forward: custom op": lambda: ops.rms_norm_op(x, w, 1e-6, 0.0),
        "forward: F.rms_norm": lambda: F.rms_norm(x, (n,), w, 1e-6),
        "backward: ops._rms_norm_backward": lambda: ops._rms_norm_backward(dy, xd, wd, rstd, 0.0),
        "backward: replay.run": lambda: replay.run(replay.RMSNORM_BWD, cfg, id(cfg), dy, xd, wd,
                                                   rstd, 0.0),
        "backward: launcher": lambda: rmsnorm_bwd.rmsnorm_bwd(dy, xd, wd, rstd, 0.0, cfg),
        "backward: custom op": lambda: ops.rms_norm_backward_op(dy, xd, wd, rstd, 0.0),
        "piece: torch.empty": lambda: torch.empty((m, n), device=dev, dtype=bf16),
        "piece: config_for": lambda: config_for(BWD, m, n, bf16, (("offset", 0.0),)),
    }, cfg


def main() -> None:
    rows, text = [], io.StringIO()
    for m, n in ((64, 4096), (16, 16384), (4096, 4096)):
        fns, cfg = pieces(m, n)
        best = dict.fromkeys(fns, float("inf"))
        for _ in range(5):
            for name, fn in fns.items():
                best[name] = min(best[name], per_call_us(fn, calls=1000, repeats=1, warmup=20))
        for name, us in best.items():
            rows.append({"m": m, "n": n, "piece": name, "eager_us": us, "dw": cfg["DW"]})
            print(json.dumps(rows[-1]), flush=True)
        for name in ("step: kerneltune.rms_norm", "forward: kerneltune.rms_norm"):
            prof = cProfile.Profile()
            fn = fns[name]
            prof.enable()
            for _ in range(500):
                fn()
            prof.disable()
            torch.cuda.synchronize()
            text.write(f"\n==== {m} x {n}: {name}, 500 calls ====\n")
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(22)
    with open(sys.argv[1], "w") as f:
        json.dump({"device": device_name(), "env": environment().__dict__, "rows": rows}, f,
                  indent=1)
    with open(sys.argv[2], "w") as f:
        f.write(text.getvalue())


if __name__ == "__main__":
    main()
