"""What cooperative row splits (COOP) share: the lane barrier, the partials' reduction, the grid.

A row split over Q = ⌈N / BLOCK_N⌉ programs keeps each chunk in registers, so that a long row
is read once and few rows still fill the GPU: program (lane, q) = divmod(pid, Q) owns column
chunk q of the row blocks lane, lane + P, … Whenever a row's chunks must agree on a value (a
sum of squares, a max), every program of the lane stores its chunk's partial, arrives at the
lane's counter and waits until all Q have; then each reduces the Q partials in the same fixed
order, so the result does not depend on timing.

A per-row value computed from the partials and also broadcast over the chunk is best stored
from a reduction in the partials' own layout: storing the broadcast one made a forward of this
design 8x (one row, 8K-element chunks) to 33x (4096 x 131072, 16K) slower on an H100 with
Triton 3.6, the cost growing with the chunk.

Waiting needs the whole grid resident at once: one program per SM, P = ⌊SMs / Q⌋ lanes. Where
Q > SMs, and in the interpreter (which runs programs one after another, so a wait would never
end), the kernel instead runs once per step with nothing to wait for (`phases`), re-reading its
chunk each time.

Device code: the kernels that use it hash this module with their own (`DEVICE_CODE_FROM`, see
`kerneltune.kernels._spec.source_hash`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kerneltune.kernels._spec import interpreting


@triton.jit
def lane_barrier(ARRIVED, lane, target):
    """Arrive at the lane's counter, then wait until it has counted `target` arrivals.

    Every thread's stores are made before the one atomic that releases them; the acquiring
    reads make the other programs' stores visible to this one (read them with .cg: L1 is not
    coherent).
    """
    tl.debug_barrier()
    tl.atomic_add(ARRIVED + lane, 1, sem="release")
    seen = tl.atomic_add(ARRIVED + lane, 0, sem="acquire")
    while seen < target:
        seen = tl.atomic_add(ARRIVED + lane, 0, sem="acquire")


@triton.jit
def load_rows(X, rb, cols, col_ok, stride_x, M, ROWS: tl.constexpr, EVICT: tl.constexpr):
    """Row block `rb`'s columns `cols` of X as stored (rows past M load nothing); read once."""
    rows = rb * ROWS + tl.arange(0, ROWS)
    mask = (rows < M)[:, None] & col_ok[None, :]
    ptrs = X + rows.to(tl.int64)[:, None] * stride_x + cols[None, :]
    if EVICT:
        return tl.load(ptrs, mask=mask, other=0.0, eviction_policy="evict_first")
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def lane_total(PART, rows, row_ok, Q, Q_POW2: tl.constexpr, MAX: tl.constexpr):
    """The rows' Q partials in PART (M x Q, fp32) reduced in a fixed order: summed, or their
    max with MAX."""
    qs = tl.arange(0, Q_POW2)
    parts = tl.load(PART + rows[:, None] * Q + qs[None, :],
                    mask=row_ok[:, None] & (qs < Q)[None, :], other=0.0, cache_modifier=".cg")
    if MAX:
        return tl.max(parts, axis=1)
    return tl.sum(parts, axis=1)


def lanes(m: int, rows: int, chunks: int, sms: int) -> int:
    """Lanes of the grid: as many as fit beside each other, one program per SM, each taking
    `chunks` programs; never more than there are row blocks."""
    return max(1, min(sms // chunks, triton.cdiv(m, rows)))


def phases(chunks: int, sms: int, steps: int) -> tuple[int, ...]:
    """The launches of a kernel whose rows agree `steps` times: one (PHASE 0, waiting at each
    step) where the lane is resident at once, else one per step (PHASE 1 … steps + 1)."""
    if chunks <= sms and not interpreting():
        return (0,)
    return tuple(range(1, steps + 2))
