"""Do quant's spinning waits take issue slots from its working warps? The staged split's wait
(`_coop_pair._poll_pair`, through `_coop_row.gather_row_pair`) beside variants that sleep
between polls (`nanosleep`); outputs compared with the shipped split's, then timed.

    PYTHONPATH=src python benchmarks/results/nvidia-h100-80gb-hbm3/quant-split/spin.py \
        out.json [MxN,...]

ncu (`ncu/`) put quant's split at 4096 x 65536 at 54% of issue slots, with a
tenth of its instructions the polls' loads, compares and branches. Variants are made by
replacing text in a copy of `kerneltune/kernels/rmsnorm_quant.py`: `sleepT` polls again only
after `nanosleep.u32 T` (about T ns).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import slack as harness

POLL = '''
@triton.jit
def _poll_pair_sleep(ptrs_a, mask_a, ptrs_b, mask_b):
    a, b = tl.inline_asm_elementwise(
        """
        {
        .reg .pred p_a, p_b, p_unset;
        setp.ne.s32 p_a, $4, 0;
        setp.ne.s32 p_b, $5, 0;
        mov.b32 $0, 0;
        mov.b32 $1, 0;
        @p_a ld.relaxed.gpu.global.b32 $0, [$2];
        @p_b ld.relaxed.gpu.global.b32 $1, [$3];
        POLL_A:
        setp.eq.b32 p_unset, $0, 0xBF800000;
        @!p_unset bra POLL_B;
        nanosleep.u32 SLEEP_NS;
        ld.relaxed.gpu.global.b32 $0, [$2];
        bra POLL_A;
        POLL_B:
        setp.eq.b32 p_unset, $1, 0xBF800000;
        @!p_unset bra DONE;
        nanosleep.u32 SLEEP_NS;
        ld.relaxed.gpu.global.b32 $1, [$3];
        bra POLL_B;
        DONE:
        }
        """,
        "=r,=r,l,l,r,r", [ptrs_a, ptrs_b, mask_a.to(tl.int32), mask_b.to(tl.int32)],
        dtype=(tl.int32, tl.int32), is_pure=False, pack=1,
    )
    return a.to(tl.float32, bitcast=True), b.to(tl.float32, bitcast=True)


@triton.jit
def _gather_row_pair_sleep(PART_A, row_a, PART_B, row_b, NQ, NQ_POW2: tl.constexpr,
                           WAIT: tl.constexpr):
    slots_a, ok = _coop_row.row_slots(row_a, NQ, NQ_POW2)
    slots_b, _ = _coop_row.row_slots(row_b, NQ, NQ_POW2)
    ok_b = ok & ((slots_b * 0 + row_b) >= 0)
    if WAIT:
        return _poll_pair_sleep(PART_A + slots_a, ok, PART_B + slots_b, ok_b)
    return (tl.load(PART_A + slots_a, mask=ok, other=0.0, cache_modifier=".cg"),
            tl.load(PART_B + slots_b, mask=ok_b, other=0.0, cache_modifier=".cg"))


@triton.jit
def _quantise_split_rows('''
CALL = "sq_parts, max_prev = gather_row_pair(PART_SQ, row, PART_MAX, prev, NQ, NQ_POW2,"
SLEEPS = (20, 100, 500)


def variant(sleep_ns: int) -> str:
    text = harness.SOURCE
    for old, new in (("\n@triton.jit\ndef _quantise_split_rows(",
                      POLL.replace("SLEEP_NS", str(sleep_ns))),
                     (CALL, CALL.replace("gather_row_pair", "_gather_row_pair_sleep"))):
        if text.count(old) != 1:
            raise SystemExit(f"source text not found once: {old!r}")
        text = text.replace(old, new)
    return text


if __name__ == "__main__":
    harness.VARIANTS = {"shipped": harness.SOURCE,
                        **{f"sleep{t}": variant(t) for t in SLEEPS}}
    shapes = (sys.argv[2].split(",") if len(sys.argv) > 2 else
              ["4096x65536", "4096x262144", "4096x32768", "2048x131072", "4096x131072",
               "16384x65536"])
    harness.timed(Path(sys.argv[1]), shapes, list(harness.VARIANTS), [])
