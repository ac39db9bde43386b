"""Quant's one-row split holding fewer arrays a thread: its weight chunk held as stored (bf16,
two to a register) and widened at each step, or the row before stored first in the step.
Registers and spills counted offline, outputs compared with the shipped split's, then timed
(`../quant-split/slack.py`'s harness). Every variant edits the quant module of commit 1214347
(`BASE`), the one before this change; `shipped` is that module as it was.

    PYTHONPATH=src:benchmarks python .../quant-store-first/probe.py regs [VARIANT,... [SPLIT,...]]
    PYTHONPATH=src:benchmarks python .../quant-store-first/probe.py compiled VARIANT,... SPLIT,...
    PYTHONPATH=src:benchmarks python .../quant-store-first/probe.py time out.json MxN,... \
        [VARIANT,...] [SPLIT,...]

(SPLIT: BLOCK_N/num_warps/GRID_MULT/num_stages.) A program of the split holds, per element,
its row x, the next row, the weight, this row's y and, until it is stored, the row before's y
(`../quant-resident/`). x, the next row and y are bf16, two to a register; the weight was
widened to fp32 once, before the row loop. At 64 elements a thread (six 2-warp programs an SM,
24K elements) the splits spilled.

- `stored_w`: the weight held as stored and widened with `_widen` (pure inline asm) at the
  step that uses it.
- `stored_w_kept`: the same widening marked impure, so that it is not hoisted out of the loop.
- `store_first`: the row before quantised and stored right after the wait that gathers its
  maxima, before this row's y is made, rather than after this row's max is published: a thread
  holds one row's y at a time.
- `store_first_w`: both.
- `store_first_skip`: `store_first` with the store of the row before skipped by a branch where
  there is none (a lane's first step); offline only.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "quant-resident"))

import probe as resident
from probe import harness
from unpack import variant

#: The commit whose quant module every variant edits.
BASE = "1214347"
harness.SOURCE = subprocess.run(
    ["git", "show", f"{BASE}:src/kerneltune/kernels/rmsnorm_quant.py"],
    cwd=Path(__file__).resolve().parents[4], capture_output=True, text=True, check=True).stdout

#: `_widen` of the base module as `_widen_kept`, its inline asm impure so that it is not hoisted
#: out of a loop (a loop-invariant v then stays as stored), placed before `_rne`.
_WIDEN = re.search(r"@triton\.jit\ndef _widen\(.*?\n\n\n", harness.SOURCE, re.S).group(0)
KEPT_WIDEN = (_WIDEN.replace("def _widen(", "def _widen_kept(")
              .replace("is_pure=True", "is_pure=False") + "@triton.jit\ndef _rne(v):")

LOAD_STORED = [
    ("    lane, n_lanes, q, cols, col_ok = lane_chunk(NQ, N, BLOCK_N)\n"
     "    w, b = _affine(W, B, cols, N, HAS_W, HAS_B)\n",
     "    lane, n_lanes, q, cols, col_ok = lane_chunk(NQ, N, BLOCK_N)\n"
     "    w, b = _affine(W, B, cols, N, HAS_W, HAS_B)\n"
     "    if ROWS == 1 and HAS_W:\n"
     "        w = tl.load(W + cols, mask=col_ok, other=0.0)\n", 1),
]


def widened_at_step(widen: str) -> list[tuple[str, str, int]]:
    return [("            r = tl.rsqrt(tl.sum(sq_parts) / N + eps) + tl.zeros([1], "
             "dtype=tl.float32)\n            y = _normed(_widen(x, SOFT_ROUND), r, w, b,",
             "            r = tl.rsqrt(tl.sum(sq_parts) / N + eps) + tl.zeros([1], "
             f"dtype=tl.float32)\n            y = _normed(_widen(x, SOFT_ROUND), r, "
             f"{widen}(w, SOFT_ROUND), b,", 1)]


#: The row before quantised and stored as soon as its max is gathered, before this row's y is
#: computed: its y is dead before this row's is live.
STORE_FIRST = [
    ("                                                     PHASE == 0)\n"
     "            r = tl.rsqrt(",
     "                                                     PHASE == 0)\n"
     "            if PHASE != 2:\n"
     "                _store_row_quantised(Q, SCALE, y_prev, tl.max(max_prev), prev, q, cols, "
     "col_ok,\n                                     stride_q, M, eps, min_scale, NQ_POW2, "
     "MODE, QMAX,\n                                     SOFT_ROUND)\n"
     "            r = tl.rsqrt(", 1),
    ("                publish(PART_MAX, row, q, NQ, M, tl.max(tl.abs(y), axis=1), 1)\n"
     "            if PHASE != 2:\n"
     "                _store_row_quantised(Q, SCALE, y_prev, tl.max(max_prev), prev, q, cols, "
     "col_ok,\n                                     stride_q, M, eps, min_scale, NQ_POW2, "
     "MODE, QMAX,\n                                     SOFT_ROUND)\n",
     "                publish(PART_MAX, row, q, NQ, M, tl.max(tl.abs(y), axis=1), 1)\n", 1),
]

#: `store_first` whose step stores the row before only where there is one: a lane's first step
#: skips the quantisation of the masked row before, which otherwise delays its max (where a
#: lane takes one step or a few, the split ran 3-5% slower than the order before).
FIRST_STEP_SKIPS_STORE = [
    ("            if PHASE != 2:\n"
     "                _store_row_quantised(Q, SCALE, y_prev, tl.max(max_prev), prev,",
     "            if PHASE != 2 and prev >= 0:\n"
     "                _store_row_quantised(Q, SCALE, y_prev, tl.max(max_prev), prev,", 1),
]


def compiled(names: list[str], splits: list[tuple[int, int, int, int]], m: int = 4096,
             n: int = 262144) -> None:
    """Registers, spilled bytes a thread and shared memory of each variant's splits as the
    GPU's own Triton compiles them (one call each)."""
    import tempfile

    import torch

    x = torch.randn(m, n, device="cuda").bfloat16()
    w = torch.ones(n, device="cuda").bfloat16()
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            module = harness.load(name, Path(tmp))
            kernel = module._rmsnorm_quant_coop_kernel
            for split in splits:
                for mode in ("int8", "fp8"):
                    kernel.device_caches.clear()
                    module.rmsnorm_quant_fwd(x, w, None, 1e-6, mode,
                                             harness.configs(m, n, [split])[-1])
                    torch.cuda.synchronize()
                    for cache in kernel.device_caches.values():
                        for k in cache[0].values():
                            print(f"{name:13} {mode} {split}: {k.n_regs} registers, "
                                  f"{k.n_spills} B spilled, {k.metadata.shared} B shared",
                                  flush=True)


if __name__ == "__main__":
    harness.VARIANTS = {
        "shipped": harness.SOURCE,
        "stored_w": variant(LOAD_STORED + widened_at_step("_widen")),
        "stored_w_kept": variant(LOAD_STORED + widened_at_step("_widen_kept") + [
            ("@triton.jit\ndef _rne(v):", KEPT_WIDEN, 1)]),
        "store_first": variant(STORE_FIRST),
        "store_first_w": variant(STORE_FIRST + LOAD_STORED + widened_at_step("_widen")),
        "store_first_skip": variant(STORE_FIRST + FIRST_STEP_SKIPS_STORE),
    }
    if sys.argv[1] == "regs":
        resident.SPLITS = ([tuple(map(int, s.split("/"))) for s in sys.argv[3].split(",")]
                           if len(sys.argv) > 3 else [*resident.SPLITS[:3], (4096, 2, 8, 3)])
        resident.registers(sys.argv[2].split(",") if len(sys.argv) > 2
                           else list(harness.VARIANTS))
    elif sys.argv[1] == "compiled":
        compiled(sys.argv[2].split(","), [tuple(map(int, s.split("/")))
                                          for s in sys.argv[3].split(",")])
    elif sys.argv[1] == "time":
        args = [*sys.argv[4:], "", ""]
        splits = ([tuple(map(int, s.split("/"))) for s in args[1].split(",") if s]
                  or resident.SPLITS)
        harness.timed(Path(sys.argv[2]), sys.argv[3].split(","),
                      args[0].split(",") if args[0] else list(harness.VARIANTS), splits)
