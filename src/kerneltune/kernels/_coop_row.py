"""What the pipelined cooperative splits share (COOP of one row a block, `num_stages` > 1): a
row's partials read into a small tile and reduced to scalars, and a scalar of the row stored
once.

`kerneltune.kernels._coop.gather` polls inside a `while` loop, which keeps the gathered tile in
its own small layout (`kerneltune.kernels._coop` says why) but keeps Triton's software pipeliner
off the row loop around it: a loop holding another loop is not pipelined. With one row a block
the partials reduce to a scalar, which has no layout to carry back into the tile, so the
polling read stands alone and the row loop is pipelined: the next row blocks' chunks are loaded
into shared memory stages ahead (`num_stages`), not into registers. At long rows the best
staged split measured faster than the best with the register prefetch, for the forward and
quant alike, with bit-identical output.

Device code: hashed with the kernels that call it (`DEVICE_CODE_FROM`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kerneltune.kernels._coop import _read
from kerneltune.kernels._coop_pair import _read_pair


@triton.jit
def row_slots(row, NQ, NQ_POW2: tl.constexpr):
    """The offsets of row `row`'s NQ partial slots (NQ_POW2, the rest masked), and the mask."""
    qs = tl.arange(0, NQ_POW2)
    return row * NQ + qs, qs < NQ


@triton.jit
def gather_row(PART, row, NQ, NQ_POW2: tl.constexpr, WAIT: tl.constexpr):
    """Row `row`'s NQ partials (NQ_POW2; 0 past NQ), with WAIT once all are published. One read
    (`kerneltune.kernels._coop._poll` spins per slot): no loop, so the row loop pipelines."""
    slots, ok = row_slots(row, NQ, NQ_POW2)
    return _read(PART + slots, ok, WAIT)


@triton.jit
def gather_row_pair(PART_A, row_a, PART_B, row_b, NQ, NQ_POW2: tl.constexpr,
                    WAIT: tl.constexpr):
    """`gather_row` of row_a in PART_A and of row_b in PART_B (0 where row_b < 0), in one wait."""
    slots_a, ok = row_slots(row_a, NQ, NQ_POW2)
    slots_b, _ = row_slots(row_b, NQ, NQ_POW2)
    # (Vector predicates: the interpreter rejects a scalar one in a mask.)
    return _read_pair(PART_A + slots_a, ok, PART_B + slots_b, ok & ((slots_b * 0 + row_b) >= 0),
                      WAIT)


@triton.jit
def store_row_scalar(PTR, row, value, q, M, NQ_POW2: tl.constexpr):
    """`value` (a scalar of row `row`) stored to PTR[row] by chunk q = 0 of a row within M."""
    qs = tl.arange(0, NQ_POW2)
    first = (qs == 0) & ((qs * 0 + q) == 0) & ((qs * 0 + row) >= 0) & ((qs * 0 + row) < M)
    tl.store(PTR + row + qs * 0, value + qs * 0.0, mask=first)
