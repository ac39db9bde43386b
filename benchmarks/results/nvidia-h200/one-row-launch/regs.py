"""Registers and SASS instructions of the forward's whole-row path against one-row Triton's
kernel at 16384 x 5120's launch (8192-element block), compiled for sm_90 without a GPU.

    PYTHONPATH=src:benchmarks python benchmarks/results/nvidia-h200/one-row-launch/regs.py
"""

from __future__ import annotations

import one_row
import sass_mix

ONE_ROW_SIG = {"X": "*bf16", "W": "*bf16", "Y": "*bf16", "stride_x": "i32", "N": "i32",
               "eps": "fp32"}


def main() -> None:
    fn, sig, consts, _ = sass_mix._kernel("rmsnorm_fwd", 8192)
    print("kernel                        warps  registers  SASS instructions")
    for warps in (4, 8):
        for pdl in (True, False):
            for evict in (False, True):
                c = {**consts, "PDL": pdl, "EVICT": evict}
                n = len(sass_mix.opcodes(sass_mix.hopper_sass(fn, sig, c, warps)))
                regs = sass_mix.hopper_registers(fn, sig, c, warps)
                print(f"kerneltune PDL={pdl!s:5} EVICT={evict!s:5}  {warps:5}  {regs:9}  {n:17}")
        c = {"BLOCK": 8192}
        n = len(sass_mix.opcodes(sass_mix.hopper_sass(one_row._fwd_kernel, ONE_ROW_SIG, c, warps)))
        regs = sass_mix.hopper_registers(one_row._fwd_kernel, ONE_ROW_SIG, c, warps)
        print(f"one-row Triton                {warps:5}  {regs:9}  {n:17}")


if __name__ == "__main__":
    main()
