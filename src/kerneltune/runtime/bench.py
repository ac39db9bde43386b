"""Host overhead of an eager call: what a user without CUDA graphs pays per call at small M.

GPU time is the tuner's business (CUDA-graph replay); this measures back-to-back eager calls
from Python, host overhead included, as the benchmarks report it next to torch's own op.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from kerneltune.runtime.ops import rms_norm


def per_call_us(fn: Callable[..., Any], *args: Any, calls: int = 2000, repeats: int = 5,
                warmup: int = 50) -> float:
    """Best over `repeats` of the mean wall time of `calls` back-to-back calls, in µs."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn(*args)
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        sync()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def rms_norm_host_overhead(m: int = 64, n: int = 4096, dtype: torch.dtype = torch.bfloat16,
                           device: str | None = None, calls: int = 2000, repeats: int = 5
                           ) -> dict[str, float]:
    """Eager µs per call of `kerneltune.rms_norm` and `torch.nn.functional.rms_norm` on the same
    (M, N) input under `torch.inference_mode`, and their ratio (the target is <= 1.2 at M <= 64).
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    x = torch.randn(m, n, device=device, dtype=dtype)
    w = torch.randn(n, device=device, dtype=dtype)
    with torch.inference_mode():
        ours = per_call_us(rms_norm, x, w, 1e-6, calls=calls, repeats=repeats)
        torch_us = per_call_us(torch.nn.functional.rms_norm, x, (n,), w, 1e-6, calls=calls,
                               repeats=repeats)
    return {"kerneltune_us": ours, "torch_rms_norm_us": torch_us, "ratio": ours / torch_us}
