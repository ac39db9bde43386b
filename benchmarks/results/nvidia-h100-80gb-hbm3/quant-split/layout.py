"""Quant with q stored in x's layout (`rmsnorm_quant_layout.py`, `_store_q`) beside quant as
shipped, which stores q 16 a thread and so loads x 32 bytes a thread: outputs compared, then
timed, at the table's configs and, for long rows, two more splits.

    PYTHONPATH=src python benchmarks/results/nvidia-h100-80gb-hbm3/quant-split/layout.py \
        out.json [MxN,...]

Rows of N >= 32768 go to out.json, the rest to out.rows.json. `differ` counts the q and scale
values that differ from the shipped kernel's: a different layout sums the squares in another
order, which moves rstd by an ulp now and then (both within the reference's bounds).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import slack as harness

SHAPES = ["4096x65536", "4096x262144", "16384x131072", "4096x32768", "2048x131072",
          "4096x131072", "16384x65536", "4096x1024", "4096x2048", "4096x5120", "4096x7168",
          "4096x14336", "4096x16384", "16384x5120", "16384x32768", "2048x14336"]
#: Splits beside the table's config, for the long rows (the rest: the table's only)
SPLITS = [(2048, 2, 8, 3), (8192, 8, 2, 3)]

if __name__ == "__main__":
    layout = (Path(__file__).parent / "rmsnorm_quant_layout.py").read_text()
    harness.VARIANTS = {"shipped": harness.SOURCE, "layout": layout}
    out = Path(sys.argv[1])
    shapes = sys.argv[2].split(",") if len(sys.argv) > 2 else SHAPES
    long_rows = [s for s in shapes if int(s.split("x")[1]) >= 32768]
    harness.timed(out, long_rows, list(harness.VARIANTS), SPLITS)
    rest = [s for s in shapes if s not in long_rows]
    if rest:
        harness.timed(out.with_suffix(".rows.json"), rest, list(harness.VARIANTS), [])
