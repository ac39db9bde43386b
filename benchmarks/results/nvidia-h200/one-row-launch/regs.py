"""Registers and SASS instructions of the forward's whole-row path against one-row Triton's
kernel at 16384 x 5120's launch (8192-element block), compiled for sm_90 without a GPU; then
a copy of that path with the dependent launch's wait and release each on or off, or the release
moved after the stores, to tell which one costs the registers.

    PYTHONPATH=src:benchmarks python benchmarks/results/nvidia-h200/one-row-launch/regs.py
"""

from __future__ import annotations

import triton
import triton.language as tl

import one_row
import sass_mix
from kerneltune.kernels._dependent_launch import release_next_grid, wait_prior_grid
from kerneltune.kernels.rmsnorm_fwd import _load_row_chunk, _normalize

ONE_ROW_SIG = {"X": "*bf16", "W": "*bf16", "Y": "*bf16", "stride_x": "i32", "N": "i32",
               "eps": "fp32"}
PROBE_SIG = {"X": "*bf16", "W": "*bf16", "Y": "*bf16", "RSTD": "*fp32", "stride_x": "i32",
             "stride_y": "i32", "M": "i32", "N": "i32", "eps": "fp32", "offset": "fp32"}


@triton.jit
def _probe_kernel(X, W, Y, RSTD, stride_x, stride_y, M, N, eps, offset,
                  BLOCK_N: tl.constexpr, WAIT: tl.constexpr, RELEASE: tl.constexpr):
    """The shipped whole-row path (one row a block, no eviction hint); RELEASE: 0 none,
    1 after the loads (shipped), 2 after the stores."""
    wait_prior_grid(WAIT)
    rows = tl.program_id(0) + tl.arange(0, 1)
    row_ok = rows < M
    rows = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = row_ok[:, None] & (cols[None, :] < N)
    x = _load_row_chunk(X + rows[:, None] * stride_x + cols[None, :], mask, False, "")
    r = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
    w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)
    release_next_grid(RELEASE == 1)
    y = _normalize(x, r[:, None], w[None, :], offset, False, Y.dtype.element_ty)
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y, mask=mask)
    tl.store(RSTD + rows, r, mask=row_ok)
    release_next_grid(RELEASE == 2)


def row(name: str, warps: int, fn, sig, consts) -> str:
    n = len(sass_mix.opcodes(sass_mix.hopper_sass(fn, sig, consts, warps)))
    return f"{name:40} {warps:5}  {sass_mix.hopper_registers(fn, sig, consts, warps):9}  {n:17}"


def main() -> None:
    fn, sig, consts, _ = sass_mix._kernel("rmsnorm_fwd", 8192)
    print(f"{'kernel':40} warps  registers  SASS instructions")
    for warps in (4, 8):
        for pdl in (True, False):
            for evict in (False, True):
                print(row(f"kerneltune PDL={pdl} EVICT={evict}", warps, fn, sig,
                          {**consts, "PDL": pdl, "EVICT": evict}))
        print(row("one-row Triton", warps, one_row._fwd_kernel, ONE_ROW_SIG, {"BLOCK": 8192}))
        for wait, release in ((True, 1), (False, 1), (True, 0), (True, 2), (False, 0)):
            where = ("none", "after loads", "after stores")[release]
            print(row(f"probe wait={wait} release={where}", warps, _probe_kernel, PROBE_SIG,
                      {"BLOCK_N": 8192, "WAIT": wait, "RELEASE": release}))


if __name__ == "__main__":
    main()
