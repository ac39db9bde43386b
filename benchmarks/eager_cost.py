"""Eager cost of kerneltune's public functions beside `F.rms_norm`, in one process.

What a user without CUDA graphs pays per call: back-to-back calls from Python, host overhead
included (`kerneltune.runtime.bench.per_call_us`: best of 5 x N calls, synchronised). Each
function runs beside torch's own op at the same shape, so a row's ratio holds whatever the
host's speed; the training step is a forward and an autograd backward. Only public functions
are called, so the same script measures any commit (``PYTHONPATH=<its src>``), which is how a
change to the launch path is checked against the code before it.

    PYTHONPATH=src python benchmarks/eager_cost.py --out eager.json [--label after]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import kerneltune
from kerneltune.env import device_name, environment
from kerneltune.runtime.bench import per_call_us

#: (M, N) of the inference calls: one token, a small batch, and row counts whose configs split
#: each row over several programs.
SHAPES = ((1, 4096), (64, 4096), (64, 8192), (16, 65536), (3000, 12288))
#: (M, N) of the training step.
TRAIN_SHAPES = ((64, 4096), (4096, 2880))


def inference_calls(x: torch.Tensor, w: torch.Tensor) -> dict[str, Callable[[], Any]]:
    n, residual = x.shape[-1], torch.randn_like(x)
    return {
        "F.rms_norm": lambda: F.rms_norm(x, (n,), w, 1e-6),
        "rms_norm": lambda: kerneltune.rms_norm(x, w),
        "add_rms_norm": lambda: kerneltune.add_rms_norm(x, residual, w),
        "rms_norm_quant int8": lambda: kerneltune.rms_norm_quant(x, w, quant="int8"),
        "rms_norm_quant fp8": lambda: kerneltune.rms_norm_quant(x, w, quant="fp8"),
    }


def training_calls(x: torch.Tensor, w: torch.Tensor) -> dict[str, Callable[[], Any]]:
    n, dy = x.shape[-1], torch.randn_like(x)
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    return {
        "F.rms_norm": lambda: F.rms_norm(x, (n,), w, 1e-6).backward(dy),
        "rms_norm": lambda: kerneltune.rms_norm(x, w).backward(dy),
    }


def measure(device: str, dtype: torch.dtype, calls: int, shapes: tuple = SHAPES,
            train_shapes: tuple = TRAIN_SHAPES) -> list[dict[str, Any]]:
    rows = []
    for mode, cases in (("inference", shapes), ("training", train_shapes)):
        for m, n in cases:
            x = torch.randn(m, n, device=device, dtype=dtype)
            w = torch.randn(n, device=device, dtype=dtype)
            fns = inference_calls(x, w) if mode == "inference" else training_calls(x, w)
            with torch.inference_mode(mode == "inference"):
                timed = {name: per_call_us(fn, calls=calls) for name, fn in fns.items()}
            base = timed["F.rms_norm"]
            rows += [{"mode": mode, "fn": name, "m": m, "n": n, "eager_us": round(us, 2),
                      "ratio_to_F.rms_norm": round(us / base, 3)} for name, us in timed.items()]
            for r in rows[-len(timed):]:
                print(json.dumps(r), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="", help="what this run measures (e.g. a commit)")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    small = device == "cpu"  # under the interpreter: the path, not the time
    rows = measure(device, getattr(torch, args.dtype), args.calls,
                   ((2, 64),) if small else SHAPES, ((2, 64),) if small else TRAIN_SHAPES)
    result = {"label": args.label, "device": device_name(), "env": environment().__dict__,
              "source": str(Path(kerneltune.__file__).parent), "dtype": args.dtype,
              "method": f"best of 5 x {args.calls} back-to-back calls, synchronised",
              "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
