"""Quant with q stored in x's layout (`_store_q`) beside quant as shipped, which stores q 16 a
thread and so loads x 32 bytes a thread: outputs compared, then timed, at the table's configs
and, for long rows, two more splits.

    PYTHONPATH=src python benchmarks/results/nvidia-h100-80gb-hbm3/quant-split/layout.py \
        out.json [MxN,...]

Rows of N >= 32768 go to out.json, the rest to out.rows.json. `differ` counts the q and scale
values that differ from the shipped kernel's: a different layout sums the squares in another
order, which moves rstd by an ulp now and then (both within the reference's bounds). The
variant replaces every store of q in a copy of `kerneltune/kernels/rmsnorm_quant.py` with
`_store_q`, which says the pointers are contiguous only in runs of one 16-byte vector of x.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import slack as harness

HELPERS = '''
@triton.jit
def _store_q(q_rows, c, q, mask, x_dtype: tl.constexpr):
    # The hint sits on an op made here: a value passed in has no op to carry it.
    ptrs = q_rows + c[None, :]
    tl.store(tl.max_contiguous(ptrs, [1, 128 // x_dtype.primitive_bitwidth]), q, mask=mask)


@triton.jit
def _store_split_q(q_rows, c, q, mask, y, Q, MODE: tl.constexpr):
    # y waits in x's dtype (fake's z in fp32, but fake's q is x's dtype).
    if MODE == 2:
        _store_q(q_rows, c, q, mask, Q.dtype.element_ty)
    else:
        _store_q(q_rows, c, q, mask, y.dtype)


@triton.jit
def _rne(v):'''
ROWS_Q = "Q + rows.to(tl.int64)[:, None] * stride_q"
STORES = [
    ("\n@triton.jit\ndef _rne(v):", HELPERS),
    (f"        tl.store({ROWS_Q} + cols[None, :],\n", f"        _store_q({ROWS_Q}, cols,\n"),
    ("                 mask=row_ok[:, None] & col_ok[None, :])\n        tl.store(SCALE",
     "                 row_ok[:, None] & col_ok[None, :], X.dtype.element_ty)\n"
     "        tl.store(SCALE"),
    ("            tl.store(q_rows + c[None, :], _quantise(y, mul, scale, MODE, QMAX, qtype, "
     "SOFT_ROUND),\n                     mask=mask)",
     "            _store_q(q_rows, c, _quantise(y, mul, scale, MODE, QMAX, qtype, SOFT_ROUND), "
     "mask, dtype)"),
    ("                tl.store(q_rows + ct[None, :],\n                         _quantise(yt, mul, "
     "scale, MODE, QMAX, qtype, SOFT_ROUND), mask=mask_t)",
     "                _store_q(q_rows, ct, _quantise(yt, mul, scale, MODE, QMAX, qtype, "
     "SOFT_ROUND),\n                         mask_t, dtype)"),
    ("                tl.store(q_rows + c[None, :], q, mask=mask)",
     "                _store_q(q_rows, c, q, mask, dtype)"),
    (f"    tl.store({ROWS_Q} + cols[None, :], qv,\n             mask=row_ok[:, None] & "
     "col_ok[None, :])",
     f"    _store_split_q({ROWS_Q}, cols, qv, row_ok[:, None] & col_ok[None, :], y, Q, MODE)"),
    (f"    tl.store({ROWS_Q} + cols[None, :], qv, mask=ok)",
     f"    _store_split_q({ROWS_Q}, cols, qv, ok, y, Q, MODE)"),
]


def variant() -> str:
    text = harness.SOURCE
    for old, new in STORES:
        if text.count(old) != 1:
            raise SystemExit(f"source text not found once: {old!r}")
        text = text.replace(old, new)
    return text


SHAPES = ["4096x65536", "4096x262144", "16384x131072", "4096x32768", "2048x131072",
          "4096x131072", "16384x65536", "4096x1024", "4096x2048", "4096x5120", "4096x7168",
          "4096x14336", "4096x16384", "16384x5120", "16384x32768", "2048x14336"]
#: Splits beside the table's config, for the long rows (the rest: the table's only)
SPLITS = [(2048, 2, 8, 3), (8192, 8, 2, 3)]

if __name__ == "__main__":
    harness.VARIANTS = {"shipped": harness.SOURCE, "layout": variant()}
    out = Path(sys.argv[1])
    shapes = sys.argv[2].split(",") if len(sys.argv) > 2 else SHAPES
    long_rows = [s for s in shapes if int(s.split("x")[1]) >= 32768]
    harness.timed(out, long_rows, list(harness.VARIANTS), SPLITS)
    rest = [s for s in shapes if s not in long_rows]
    if rest:
        harness.timed(out.with_suffix(".rows.json"), rest, list(harness.VARIANTS), [])
