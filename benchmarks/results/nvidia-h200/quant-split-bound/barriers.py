"""Barriers, async copies and atomics in the PTX of quant's split (one row a block, 4K chunks,
2 warps, three stages, PHASE 0, int8) per variant, compiled for sm_90 without a GPU by this
machine's Triton: the README's count behind `one_reduction` (one barrier fewer than shipped).

    PYTHONPATH=src:benchmarks python benchmarks/results/nvidia-h200/quant-split-bound/barriers.py
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget

from quant_variants import variant

SIGNATURE = {"PART_SQ": "*fp32", "PART_MAX": "*fp32", "NQ": "i32", "X": "*bf16", "W": "*bf16",
             "B": "*bf16", "Q": "*i8", "SCALE": "*fp32", "stride_x": "i32", "stride_q": "i32",
             "M": "i32", "N": "i32", "eps": "fp32", "min_scale": "fp32"}
CONSTANTS = {"BLOCK_N": 4096, "ROWS": 1, "NQ_POW2": 16, "PHASE": 0, "EVICT": True, "MODE": 0,
             "QMAX": 127.0, "HAS_W": True, "HAS_B": False, "SOFT_ROUND": False, "STAGES": 3}


def main(names: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            kernel = variant(name, Path(tmp))._rmsnorm_quant_coop_kernel
            source = triton.compiler.ASTSource(
                fn=kernel, signature={**SIGNATURE, **dict.fromkeys(CONSTANTS, "constexpr")},
                constexprs=CONSTANTS)
            ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                 options={"num_warps": 2, "maxnreg": 168}).asm["ptx"]
            print(f"{name}: {len(re.findall(r'bar[.]sync|barrier[.]sync', ptx))} barriers, "
                  f"{ptx.count('cp.async')} cp.async, {ptx.count('atom.')} atomics "
                  f"(Triton {triton.__version__})")


if __name__ == "__main__":
    main(sys.argv[1:] or ["shipped", "one_reduction", "no_max_at_all"])
