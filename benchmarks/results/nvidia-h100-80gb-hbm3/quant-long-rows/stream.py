"""GPU time of torch's bf16 -> int8 and -> fp8 `copy_` (2 bytes read, 1 written an element):
what quant's traffic alone reaches at long rows, beside a copy of the same bytes.

    PYTHONPATH=src python benchmarks/results/nvidia-h100-80gb-hbm3/quant-long-rows/stream.py \
        stream.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from kerneltune.tuner.timing import copy_bandwidth_gbps, copy_time_us, graph_time, rotation_count

SHAPES = [(4096, 32768), (16384, 32768), (4096, 65536), (4096, 262144), (16384, 65536),
          (4096, 16384), (16384, 16384)]


def cast_row(m: int, n: int, to: str, dtype: torch.dtype, copy_gbps: float) -> dict:
    """One shape's cast timed over rotating inputs (> 4x the L2), as the tuner times kernels."""
    nbytes = m * n * 3
    sets = rotation_count(nbytes)
    xs = [torch.randn(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    qs = [torch.empty(m, n, device="cuda", dtype=dtype) for _ in range(sets)]
    t = graph_time(lambda i: qs[i].copy_(xs[i]), sets)
    return {"m": m, "n": n, "to": to, "us": t.median_us,
            "copy_same_bytes_us": copy_time_us(nbytes),
            "frac_copy": nbytes / (t.median_us * 1e-6) / 1e9 / copy_gbps}


def main() -> None:
    copy_gbps = copy_bandwidth_gbps("cuda")
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "copy_gbps": copy_gbps, "rows": []}
    for m, n in SHAPES:
        for to, dtype in (("int8", torch.int8), ("fp8", torch.float8_e4m3fn)):
            row = cast_row(m, n, to, dtype, copy_gbps)
            out["rows"].append(row)
            print(row, flush=True)
            torch.cuda.empty_cache()
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
