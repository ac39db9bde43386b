"""Quant's split with its gathers' first reads issued early, or its maxima gathered late,
beside the split as shipped: outputs compared with the shipped split's, then timed.

    PYTHONPATH=src python benchmarks/results/nvidia-h100-80gb-hbm3/quant-early-reads/probe.py \
        out.json [MxN,...] [VARIANT,...]

In the shipped step of row r a program loads row r + P (P lanes), publishes its sum of squares,
then gathers r's sums with the maxima of r - P in one wait, computes y of r, publishes its max
and quantises r - P. The wait's first reads go out only after the publish, so each step spends
an L2 round trip there with nothing else to do; and the maxima of r - P were published halfway
through the peers' previous step, half a step of slack.

- `late_max`: r's sums gathered where they are now; the maxima of r - P gathered after this
  step publishes r's, right before they are used: a whole step of slack, two waits a step.
- `early`: both gathers' first reads issued at the top of the step, before the load and the
  sum of squares; each is then polled only where its first read found a slot unpublished, the
  sums where the shipped wait is, the maxima where `late_max` waits.

The maxima's gather masks the row before the lane's first (the shipped pair gather does;
a first cut of `late_max` did not, and waited forever on slots no program publishes).
Only the one-launch path (PHASE 0, compiled) changes: the interpreter runs the phases apart.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "quant-split"))
sys.path.insert(0, str(Path(__file__).parents[1] / "quant-unpack"))

import slack as harness
from unpack import variant

HELPERS = '''

@triton.jit
def _peek(ptrs, mask):
    """Each slot read once from L2, without waiting: UNSET where not yet published, 0 where
    masked. Its result is used only later, so the load's latency overlaps the work between."""
    return tl.inline_asm_elementwise(
        """
        {
        .reg .pred p_slot;
        setp.ne.s32 p_slot, $2, 0;
        mov.b32 $0, 0;
        @p_slot ld.relaxed.gpu.global.b32 $0, [$1];
        }
        """,
        "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1,
    ).to(tl.float32, bitcast=True)


@triton.jit
def _settle(ptrs, mask, early):
    """`early` (a `_peek` of the slots) where it was published; elsewhere the slot read again
    until it is."""
    return tl.inline_asm_elementwise(
        """
        {
        .reg .pred p_slot, p_unset;
        mov.b32 $0, $3;
        setp.ne.s32 p_slot, $2, 0;
        @!p_slot bra DONE;
        POLL:
        setp.eq.b32 p_unset, $0, 0xBF800000;
        @!p_unset bra DONE;
        ld.relaxed.gpu.global.b32 $0, [$1];
        bra POLL;
        DONE:
        }
        """,
        "=r,l,r,r", [ptrs, mask.to(tl.int32), early.to(tl.int32, bitcast=True)],
        dtype=tl.int32, is_pure=False, pack=1,
    ).to(tl.float32, bitcast=True)


@triton.jit
def _store_row_quantised('''

#: The shipped split's row loop (`_quantise_split_rows`), from its `for` to its last statement.
LOOP = re.search(r"    for row in tl\.range\(lane, M, n_lanes, num_stages=STAGES\):\n.*?"
                 r"        x = x_ahead\n", harness.SOURCE, re.S).group(0)

#: The maxima of the row before gathered after this row's are published (the other phases as
#: shipped).
LATE_MAX_LOOP = """    for row in tl.range(lane, M, n_lanes, num_stages=STAGES):
        x_ahead = load_rows(X, row + n_lanes, cols, col_ok, stride_x, M, 1, EVICT)
        if PHASE <= 1:
            xf = _widen(x_ahead, SOFT_ROUND)
            publish(PART_SQ, row + n_lanes, q, NQ, M, tl.sum(xf * xf, axis=1), 1)
        if PHASE != 1:
            prev = row - n_lanes
            sq_parts = gather_row(PART_SQ, row, NQ, NQ_POW2, PHASE == 0)
            r = tl.rsqrt(tl.sum(sq_parts) / N + eps) + tl.zeros([1], dtype=tl.float32)
            y = _normed(_widen(x, SOFT_ROUND), r, w, b, MODE, HAS_W, HAS_B, dtype, SOFT_ROUND)
            if PHASE <= 2:
                publish(PART_MAX, row, q, NQ, M, tl.max(tl.abs(y), axis=1), 1)
            if PHASE != 2:
                slots_prev, ok = row_slots(prev, NQ, NQ_POW2)
                max_prev = _read(PART_MAX + slots_prev, ok & ((slots_prev * 0 + prev) >= 0),
                                 PHASE == 0)
                _store_row_quantised(Q, SCALE, y_prev, tl.max(max_prev), prev, q, cols, col_ok,
                                     stride_q, M, eps, min_scale, NQ_POW2, MODE, QMAX,
                                     SOFT_ROUND)
            y_prev = y.to(y_prev.dtype)
        x = x_ahead
"""

#: As LATE_MAX_LOOP, with both gathers' first reads (PHASE 0) at the top of the step.
EARLY_LOOP = """    for row in tl.range(lane, M, n_lanes, num_stages=STAGES):
        prev = row - n_lanes
        slots, ok = row_slots(row, NQ, NQ_POW2)
        slots_prev, _ = row_slots(prev, NQ, NQ_POW2)
        ok_prev = ok & ((slots_prev * 0 + prev) >= 0)
        if PHASE == 0:
            sq_early = _peek(PART_SQ + slots, ok)
            max_early = _peek(PART_MAX + slots_prev, ok_prev)
        x_ahead = load_rows(X, row + n_lanes, cols, col_ok, stride_x, M, 1, EVICT)
        if PHASE <= 1:
            xf = _widen(x_ahead, SOFT_ROUND)
            publish(PART_SQ, row + n_lanes, q, NQ, M, tl.sum(xf * xf, axis=1), 1)
        if PHASE != 1:
            if PHASE == 0:
                sq_parts = _settle(PART_SQ + slots, ok, sq_early)
            else:
                sq_parts = gather_row(PART_SQ, row, NQ, NQ_POW2, False)
            r = tl.rsqrt(tl.sum(sq_parts) / N + eps) + tl.zeros([1], dtype=tl.float32)
            y = _normed(_widen(x, SOFT_ROUND), r, w, b, MODE, HAS_W, HAS_B, dtype, SOFT_ROUND)
            if PHASE <= 2:
                publish(PART_MAX, row, q, NQ, M, tl.max(tl.abs(y), axis=1), 1)
            if PHASE != 2:
                if PHASE == 0:
                    max_prev = _settle(PART_MAX + slots_prev, ok_prev, max_early)
                else:
                    max_prev = gather_row(PART_MAX, prev, NQ, NQ_POW2, False)
                _store_row_quantised(Q, SCALE, y_prev, tl.max(max_prev), prev, q, cols, col_ok,
                                     stride_q, M, eps, min_scale, NQ_POW2, MODE, QMAX,
                                     SOFT_ROUND)
            y_prev = y.to(y_prev.dtype)
        x = x_ahead
"""

IMPORT = "from kerneltune.kernels._coop_row import gather_row, gather_row_pair, store_row_scalar"
ROW_SLOTS = (IMPORT, IMPORT.replace("gather_row_pair,", "gather_row_pair, row_slots,"), 1)
READ = ("from kerneltune.kernels._coop import gather,",
        "from kerneltune.kernels._coop import _read, gather,", 1)
LATE_MAX = [(LOOP, LATE_MAX_LOOP, 1), ROW_SLOTS, READ]
EARLY = [
    ("\n\n@triton.jit\ndef _store_row_quantised(", HELPERS, 1),
    (LOOP, EARLY_LOOP, 1),
    ROW_SLOTS,
]


SHAPES = ["4096x262144", "4096x65536", "2048x262144", "4096x131072", "16384x131072"]

if __name__ == "__main__":
    harness.VARIANTS = {"shipped": harness.SOURCE, "late_max": variant(LATE_MAX),
                        "early": variant(EARLY)}
    shapes = sys.argv[2].split(",") if len(sys.argv) > 2 and sys.argv[2] else SHAPES
    names = sys.argv[3].split(",") if len(sys.argv) > 3 else list(harness.VARIANTS)
    harness.timed(Path(sys.argv[1]), shapes, names, [])
