"""Quant with bf16 widened to fp32 by one integer op an element beside quant as shipped:
outputs compared, then timed, at the table's configs.

    PYTHONPATH=src python benchmarks/results/nvidia-h100-80gb-hbm3/quant-unpack/unpack.py \
        out.json [MxN,...]

A bf16 value is the high half of its fp32. Two of them share a 32-bit register, and
`.to(tl.float32)` extracts each into a register of its own first: the high one takes a PRMT
and a shift where one AND would do (the low one a shift, as it must). `_widen` unpacks a
register's pair in PTX, one op each. Compiled for sm_90 by Triton 3.9, the split's row loop
(4K chunks, 4 warps) drops from 21.4 to 18.8 SASS instructions an element. `widen` changes the
split's three unpackings (x for its sum of squares, x for y, y for q); `widen_all` also the
whole-row kernel's loads.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "quant-split"))

import slack as harness

from kerneltune.kernels import rmsnorm_quant

#: The commit whose quant module the variants edit (the split before it widened with `_widen`).
BASE = "85e8559"
ROOT = Path(__file__).resolve().parents[4]
#: `_widen` as shipped since, inserted before the first helper that uses it.
WIDEN = f"""

@triton.jit
{rmsnorm_quant._widen.src}

@triton.jit
def _load_part("""
SPLIT = [
    ("\n\n@triton.jit\ndef _load_part(", WIDEN, 1),
    ("xf = x_ahead.to(tl.float32)", "xf = _widen(x_ahead, SOFT_ROUND)", 2),
    ("xf = x.to(tl.float32)", "xf = _widen(x, SOFT_ROUND)", 1),
    ("_normed(x.to(tl.float32),", "_normed(_widen(x, SOFT_ROUND),", 2),
    ("qv = _quantise(y.to(tl.float32),", "qv = _quantise(_widen(y, SOFT_ROUND),", 2),
]
WHOLE_ROW = [
    ("def _load_row_chunk(ptrs, mask, EVICT: tl.constexpr, POLICY: tl.constexpr):",
     "def _load_row_chunk(ptrs, mask, EVICT: tl.constexpr, POLICY: tl.constexpr,\n"
     "                    SOFT_ROUND: tl.constexpr = False):", 1),
    ("other=0.0)\n    return v.to(tl.float32)\n", "other=0.0)\n    return _widen(v, SOFT_ROUND)\n",
     1),
    ("x = x_next.to(tl.float32)", "x = _widen(x_next, SOFT_ROUND)", 1),
]

#: On top of SPLIT: x carried to the next step in fp32 (its sum of squares widened it already);
#: compiled only (`loop_mix.py`): it spills at four programs an SM
CARRY_X = [
    ("        x_ahead = x_next\n", "        x_ahead = _widen(x_next, SOFT_ROUND)\n", 1),
    ("        x_ahead = load_rows(X, row + n_lanes, cols, col_ok, stride_x, M, 1, EVICT)\n",
     "        x_ahead = _widen(load_rows(X, row + n_lanes, cols, col_ok, stride_x, M, 1, EVICT),\n"
     "                         SOFT_ROUND)\n", 1),
    ("            xf = _widen(x_ahead, SOFT_ROUND)\n", "            xf = x_ahead\n", 2),
    ("    x = load_rows(X, lane, cols, col_ok, stride_x, M, ROWS, EVICT)\n",
     "    x = _widen(load_rows(X, lane, cols, col_ok, stride_x, M, ROWS, EVICT), SOFT_ROUND)\n", 1),
    ("        xf = _widen(x, SOFT_ROUND)\n", "        xf = x\n", 1),
    ("_normed(_widen(x, SOFT_ROUND),", "_normed(x,", 2),
]
#: On top of CARRY_X: y waits a step in fp32, not in x's dtype
CARRY_Y = [
    ("        y_prev = tl.zeros([ROWS, BLOCK_N], dtype=dtype)",
     "        y_prev = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)", 1),
    ("        y_prev = tl.zeros([1, BLOCK_N], dtype=dtype)",
     "        y_prev = tl.zeros([1, BLOCK_N], dtype=tl.float32)", 1),
]


def base_source() -> str:
    """The quant module of `BASE`, which the probe ran against."""
    return subprocess.run(["git", "show", f"{BASE}:src/kerneltune/kernels/rmsnorm_quant.py"],
                          cwd=ROOT, capture_output=True, text=True, check=True).stdout


def variant(edits) -> str:
    text = harness.SOURCE
    for old, new, count in edits:
        if text.count(old) != count:
            raise SystemExit(f"source text not found {count} times: {old!r}")
        text = text.replace(old, new)
    return text


SHAPES = ["4096x65536", "4096x131072", "4096x262144", "16384x131072", "2048x131072",
          "4096x32768", "16384x65536", "4096x5120", "4096x7168", "4096x2048", "4096x14336",
          "4096x1024", "16384x5120", "256x5120"]

if __name__ == "__main__":
    harness.SOURCE = base_source()
    harness.VARIANTS = {"shipped": harness.SOURCE, "widen": variant(SPLIT),
                        "widen_all": variant(SPLIT + WHOLE_ROW)}
    shapes = sys.argv[2].split(",") if len(sys.argv) > 2 else SHAPES
    harness.timed(Path(sys.argv[1]), shapes, list(harness.VARIANTS), [])
