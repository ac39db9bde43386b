"""Barriers, async copies and atomics in the PTX of quant's split (one row a block, three
stages, PHASE 0, int8) per variant, compiled for sm_90 without a GPU by this machine's Triton,
at the pick's split (4K chunks, 2 warps, six programs an SM) and at twelve 2K programs of one
warp: the README's counts behind `one_reduction` (one barrier fewer than shipped) and behind
the one-warp split (whose reductions take none).

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
CONSTANTS = {"ROWS": 1, "PHASE": 0, "EVICT": True, "MODE": 0, "QMAX": 127.0, "HAS_W": True,
             "HAS_B": False, "SOFT_ROUND": False, "STAGES": 3}
#: (BLOCK_N, warps, registers a thread) of each split, 65536 columns (NQ_POW2 = chunks).
SPLITS = ((4096, 2, 168), (2048, 1, 168))


def main(names: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            kernel = variant(name, Path(tmp))._rmsnorm_quant_coop_kernel
            for block, warps, regs in SPLITS:
                constants = {**CONSTANTS, "BLOCK_N": block, "NQ_POW2": 65536 // block}
                source = triton.compiler.ASTSource(
                    fn=kernel, signature={**SIGNATURE, **dict.fromkeys(constants, "constexpr")},
                    constexprs=constants)
                ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                     options={"num_warps": warps, "maxnreg": regs}).asm["ptx"]
                print(f"{name}, {block} w{warps}: "
                      f"{len(re.findall(r'bar[.]sync|barrier[.]sync', ptx))} barriers, "
                      f"{ptx.count('cp.async')} cp.async, {ptx.count('atom.')} atomics "
                      f"(Triton {triton.__version__})")


if __name__ == "__main__":
    main(sys.argv[1:] or ["shipped", "one_reduction", "no_max_at_all"])
