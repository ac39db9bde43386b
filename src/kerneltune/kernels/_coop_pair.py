"""A gather of two agreements in one wait, for a cooperative split whose step needs two values
its peers published in the same earlier step (quant: the next block's sums of squares and this
block's maxima). Waiting on them one after the other costs two L2 round trips a step; here both
first reads go out together.

Device code: hashed with the kernels that call it (`DEVICE_CODE_FROM`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kerneltune.kernels._coop import UNSET, _read


@triton.jit
def _poll_pair(ptrs_a, mask_a, ptrs_b, mask_b):
    """`kerneltune.kernels._coop._poll` of two slots at once: both read, then each read again
    until it is not UNSET (-1.0f)."""
    a, b = tl.inline_asm_elementwise(
        """
        {
        .reg .pred p_a, p_b, p_unset;
        setp.ne.s32 p_a, $4, 0;
        setp.ne.s32 p_b, $5, 0;
        mov.b32 $0, 0;
        mov.b32 $1, 0;
        @p_a ld.relaxed.gpu.global.b32 $0, [$2];
        @p_b ld.relaxed.gpu.global.b32 $1, [$3];
        POLL_A:
        setp.eq.b32 p_unset, $0, 0xBF800000;
        @!p_unset bra POLL_B;
        ld.relaxed.gpu.global.b32 $0, [$2];
        bra POLL_A;
        POLL_B:
        setp.eq.b32 p_unset, $1, 0xBF800000;
        @!p_unset bra DONE;
        ld.relaxed.gpu.global.b32 $1, [$3];
        bra POLL_B;
        DONE:
        }
        """,
        "=r,=r,l,l,r,r", [ptrs_a, ptrs_b, mask_a.to(tl.int32), mask_b.to(tl.int32)],
        dtype=(tl.int32, tl.int32), is_pure=False, pack=1,
    )
    return a.to(tl.float32, bitcast=True), b.to(tl.float32, bitcast=True)


@triton.jit
def _read_pair(ptrs_a, mask_a, ptrs_b, mask_b, WAIT: tl.constexpr):
    if WAIT:
        return _poll_pair(ptrs_a, mask_a, ptrs_b, mask_b)
    return _read(ptrs_a, mask_a, False), _read(ptrs_b, mask_b, False)


@triton.jit
def gather_pair(PART_A, rows_a, ok_a, PART_B, rows_b, ok_b, NQ, NQ_POW2: tl.constexpr,
                WAIT: tl.constexpr):
    """`kerneltune.kernels._coop.gather` of the partials of rows_a in PART_A and of rows_b in
    PART_B (each ROWS, NQ_POW2; 0 past NQ and where not ok), with WAIT in one wait."""
    qs = tl.arange(0, NQ_POW2)
    ptrs_a = PART_A + rows_a[:, None] * NQ + qs[None, :]
    ptrs_b = PART_B + rows_b[:, None] * NQ + qs[None, :]
    mask_a = ok_a[:, None] & (qs < NQ)[None, :]
    mask_b = ok_b[:, None] & (qs < NQ)[None, :]
    a, b = _read_pair(ptrs_a, mask_a, ptrs_b, mask_b, WAIT)
    while tl.max(tl.where((a == UNSET) | (b == UNSET), 1, 0)) > 0:
        a, b = _read_pair(ptrs_a, mask_a, ptrs_b, mask_b, WAIT)
    return a, b
