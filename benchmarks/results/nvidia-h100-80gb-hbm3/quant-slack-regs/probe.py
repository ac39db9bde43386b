"""Quant's split with the maxima gathered two steps after they are published (`slack2`, as in
`../quant-split/slack.py`, on the widened split), and the same with the weight re-read each
step rather than held in registers (`slack2_w`), beside the split as shipped: outputs compared
with the shipped split's, then timed.

    PYTHONPATH=src python benchmarks/results/nvidia-h100-80gb-hbm3/quant-slack-regs/probe.py \
        out.json [MxN,...] [VARIANT,...] [BLOCK_N/num_warps/GRID_MULT/num_stages,...]

`../quant-split/` found that slack2 spilled at four programs an SM (the register cap of 128),
while at two it ran 1.01-1.11x the shipped split of two. The weight's chunk takes 16 of those
registers for the whole loop; re-read each step (from L1 or the pipeliner's shared memory) it
leaves room for the second held row.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "quant-split"))
sys.path.insert(0, str(Path(__file__).parents[1] / "quant-unpack"))

import slack as harness
from unpack import variant

#: `slack.SLACK2` on the widened split: its unpackings through `_widen`, as shipped.
SLACK2 = (harness.SLACK2.replace("xf = x_ahead.to(tl.float32)", "xf = _widen(x_ahead, SOFT_ROUND)")
          .replace("_normed(x.to(tl.float32),", "_normed(_widen(x, SOFT_ROUND),"))
SLACK2_W = (SLACK2.replace("eps, min_scale, x, w, b, lane,", "eps, min_scale, x, W, B, lane,")
            .replace("        x_ahead = load_rows(X, row + n_lanes, cols, col_ok, stride_x, M, 1, "
                     "EVICT)\n",
                     "        x_ahead = load_rows(X, row + n_lanes, cols, col_ok, stride_x, M, 1, "
                     "EVICT)\n        w, b = _affine(W, B, cols, N, HAS_W, HAS_B)\n"))
#: The coop kernel's call of the one-row loop, up to the arguments the variant changes.
CALL = ("        _quantise_split_rows(PART_SQ, PART_MAX, NQ, X, Q, SCALE, stride_x, stride_q, M, N,"
        " eps,\n                             min_scale, x, w, b, lane,")


def _rows_fn(text: str) -> tuple[str, str, int]:
    return (harness.ROWS_FN.search(harness.SOURCE).group(0), text, 1)


SHAPES = ["4096x262144", "2048x262144", "4096x65536", "16384x131072"]

if __name__ == "__main__":
    harness.VARIANTS = {
        "shipped": harness.SOURCE,
        "slack2": variant([_rows_fn(SLACK2)]),
        "slack2_w": variant([_rows_fn(SLACK2_W), (CALL, CALL.replace("x, w, b, lane,",
                                                                     "x, W, B, lane,"), 1)]),
    }
    shapes = sys.argv[2].split(",") if len(sys.argv) > 2 and sys.argv[2] else SHAPES
    names = sys.argv[3].split(",") if len(sys.argv) > 3 and sys.argv[3] else list(harness.VARIANTS)
    splits = [tuple(map(int, s.split("/"))) for s in sys.argv[4].split(",")] \
        if len(sys.argv) > 4 else []
    harness.timed(Path(sys.argv[1]), shapes, names, splits)
