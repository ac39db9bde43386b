"""What the norms' cooperative row splits share beyond `kerneltune.kernels._coop`: r of a row
block from its gathered partial sums of squares, stored once per row.

r is stored from a reduction in the partials' own small (ROWS, NQ_POW2) layout, not as the r
broadcast over the chunk (`kerneltune.kernels._coop` says why).

Device code: hashed with the kernels that call it (`DEVICE_CODE_FROM`).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def lane_rstd(parts, RSTD, rows, row_ok, q, N, eps, NQ_POW2: tl.constexpr):
    """r (ROWS,) of the rows from their gathered partial sums of squares `parts`
    (ROWS, NQ_POW2); chunk q = 0 stores it to RSTD."""
    qs = tl.arange(0, NQ_POW2)
    r_parts = tl.rsqrt(tl.sum(parts, axis=1, keep_dims=True) / N + eps) + qs[None, :] * 0.0
    # (A vector predicate: the interpreter rejects a scalar one in a mask.)
    first = (qs == 0)[None, :] & ((qs * 0 + q) == 0)[None, :]
    tl.store(RSTD + rows[:, None] + qs[None, :] * 0, r_parts, mask=row_ok[:, None] & first)
    return tl.rsqrt(tl.sum(parts, axis=1) / N + eps)
