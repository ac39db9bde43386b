"""What do quant's two agreements cost its staged split? The shipped split beside variants that
read a partial without waiting for it (wrong values, timing only: only `shipped` is right).

    PYTHONPATH=src python benchmarks/results/nvidia-h100-80gb-hbm3/quant-split/waits.py \
        out.json [MxN,...]

Variants of `kerneltune/kernels/rmsnorm_quant.py`'s `_quantise_split_rows`, by replacing text:
- `no_max_wait`: waits for this row's sums of squares only, and reads the row before's maxima
  as they are (everything else as shipped: the maxima are still computed and published);
- `no_wait`: waits for neither.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import slack as harness

PAIR_CALL = "sq_parts, max_prev = gather_row_pair(PART_SQ, row, PART_MAX, prev, NQ, NQ_POW2,\n"
PAIR = " " * 16 + PAIR_CALL + " " * 53 + "PHASE == 0)"
NO_MAX_WAIT = """                sq_parts = gather_row(PART_SQ, row, NQ, NQ_POW2, PHASE == 0)
                max_prev = gather_row(PART_MAX, tl.maximum(prev, 0), NQ, NQ_POW2, False)"""
NO_WAIT = " " * 16 + PAIR_CALL + " " * 53 + "False)"


def variant(new: str) -> str:
    if harness.SOURCE.count(PAIR) != 1:
        raise SystemExit("source text not found once")
    return harness.SOURCE.replace(PAIR, new)


if __name__ == "__main__":
    harness.VARIANTS = {"shipped": harness.SOURCE, "no_max_wait": variant(NO_MAX_WAIT),
                        "no_wait": variant(NO_WAIT)}
    shapes = (sys.argv[2].split(",") if len(sys.argv) > 2 else
              ["4096x65536", "4096x262144", "4096x32768", "16384x65536"])
    harness.timed(Path(sys.argv[1]), shapes, list(harness.VARIANTS), [])
