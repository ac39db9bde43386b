"""Host time of a bound call and of its pieces, in one process (µs a call, best of 7 rounds
of 3 x 2000 calls, the rounds interleaving the pieces).

    PYTHONPATH=src python benchmarks/results/nvidia-h100-80gb-hbm3/bound-calls/pieces.py out.json
"""

from __future__ import annotations

import json
import sys
import timeit
from pathlib import Path

import torch

import kerneltune
from kerneltune.runtime import launch, ops


def forward_key(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> tuple:
    """The key `rms_norm` alone had before every call site shared `launch.call_key`."""
    return (type(x), x.shape, x.stride(), x.dtype, x.get_device(), x.data_ptr() & 15,
            type(weight), weight.shape, weight.stride(), weight.dtype, weight.get_device(),
            weight.data_ptr() & 15, type(eps), eps, type(offset), offset)


def main() -> None:
    x, r = (torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    site, args = ops._RMS_NORM_INFERENCE, (x, w, 1e-6, 0.0)
    cases = {
        "kerneltune.rms_norm": lambda: kerneltune.rms_norm(x, w),
        "kerneltune.add_rms_norm": lambda: kerneltune.add_rms_norm(x, r, w),
        "kerneltune.rms_norm_quant": lambda: kerneltune.rms_norm_quant(x, w),
        "kerneltune.rms_norm_fake_quant": lambda: kerneltune.rms_norm_fake_quant(x, w),
        "launch.run_bound (rms_norm inference)": lambda: launch.run_bound(site, *args),
        "launch.call_key": lambda: hash(launch.call_key(site, args)),
        "forward_key (rms_norm's own, before)": lambda: hash(forward_key(*args)),
        "torch.empty_like(x)": lambda: torch.empty_like(x),
        "torch.empty_like(x, dtype=int8)": lambda: torch.empty_like(x, dtype=torch.int8),
        "torch.empty((64, 1), dtype=fp32, device=)": lambda: torch.empty(
            (64, 1), dtype=torch.float32, device=x.device),
        "x.new_empty((64, 1), dtype=fp32)": lambda: x.new_empty((64, 1), dtype=torch.float32),
        "launch.capturing()": launch.capturing,
        "launch.current_device()": launch.current_device,
    }
    best = dict.fromkeys(cases, float("inf"))
    with torch.inference_mode():
        for fn in list(cases.values())[:4]:  # the first call binds
            fn()
        assert launch.run_bound(site, *args) is not None
        for _ in range(7):
            for name, fn in cases.items():
                us = min(timeit.repeat(fn, number=2000, repeat=3)) / 2000 * 1e6
                best[name] = min(best[name], us)
            torch.cuda.synchronize()
    result = {name: round(us, 3) for name, us in best.items()}
    print(json.dumps(result, indent=1))
    Path(sys.argv[1]).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
