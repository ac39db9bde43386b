"""What cooperative row splits (COOP) share: the lane layout, the partials' agreement, the launch.

A row split over Q = ⌈N / BLOCK_N⌉ programs keeps each chunk in registers, so that a long row
is read once and a few long rows still use every SM: program (lane, q) = divmod(pid, Q) owns
column chunk q of the row blocks lane, lane + P, … Whenever a row's chunks must agree on a
value (a sum of squares, a max), every program of the lane publishes its chunk's partial and
gathers the Q partials of its rows; each reduces them in the same fixed order, so the result
does not depend on timing. (QuACK splits a long row over a thread-block cluster; this is the
same idea through global memory, on any GPU.)

The partial is its own flag: the buffer starts as `UNSET` (no sum of squares or max of |y|
takes it, NaN included), a program writes each slot once with a relaxed atomic, and a gather
waits until no slot of its rows is UNSET (`gather`). Nothing is fenced or counted: a lane
barrier (a release atomic on a counter, then acquiring polls) drained the program's stores and
took several L2 round trips per row block, a large share of the forward's time.

A per-row value computed from the partials and also broadcast over the chunk is best stored
from a reduction in the partials' own layout: storing the broadcast one made the forward many
times slower with Triton 3.6, the more so the larger the chunk.

Waiting needs the whole grid resident at once: GRID_MULT programs per SM (a config's choice),
P = ⌊GRID_MULT · SMs / Q⌋ lanes, each program's registers capped so that GRID_MULT fit beside
each other (`resident_options`). Several per SM hide one program's waits behind another's
loads. Where Q > SMs, and in the interpreter (which runs programs one after another, so a wait
would never end), the kernel instead runs once per step with nothing to wait for (`phases`),
re-reading its chunk each time.

Device code: the kernels that use it hash this module with their own (`DEVICE_CODE_FROM`, see
`kerneltune.kernels._spec.device_code_hash`).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from kerneltune.kernels._config import KernelConfig
from kerneltune.kernels._launch import Launch
from kerneltune.kernels._spec import interpreting, launch_options, next_pow2, sm_count

#: What a partial slot holds until its program publishes it (`_poll` compares its bits).
UNSET = tl.constexpr(-1.0)


@triton.jit
def lane_chunk(NQ, N, BLOCK_N: tl.constexpr):
    """This program's lane, the number of lanes, its chunk q and the chunk's columns."""
    pid = tl.program_id(0)
    cols = (pid % NQ) * BLOCK_N + tl.arange(0, BLOCK_N)
    return pid // NQ, tl.num_programs(0) // NQ, pid % NQ, cols, cols < N


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
def publish(PART, rb, q, NQ, M, value, ROWS: tl.constexpr):
    """Row block `rb`'s partials `value` (ROWS,) of chunk q into PART (M x NQ, fp32).

    Written as int32 bits: the interpreter has no float atomic exchange."""
    rows = rb * ROWS + tl.arange(0, ROWS)
    slots = PART.to(tl.pointer_type(tl.int32)) + rows * NQ + q
    tl.atomic_xchg(slots, value.to(tl.int32, bitcast=True), mask=rows < M, sem="relaxed")


@triton.jit
def _poll(ptrs, mask):
    """Each slot read, by each thread that holds a copy of it, until it is not UNSET (-1.0f).

    In PTX, one spin per element: a reduction over a tile that threads hold several copies of
    sees one copy of each slot, so a poll ending on it let other threads go on with their copy
    of a slot read before it was published, and the forward returned wrong values (Triton 3.6,
    2K chunks of several rows in 8 warps)."""
    return tl.inline_asm_elementwise(
        """
        {
        .reg .pred p_slot, p_unset;
        setp.ne.s32 p_slot, $2, 0;
        mov.b32 $0, 0;
        @!p_slot bra DONE;
        POLL:
        ld.relaxed.gpu.global.b32 $0, [$1];
        setp.eq.b32 p_unset, $0, 0xBF800000;
        @p_unset bra POLL;
        DONE:
        }
        """,
        "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1,
    ).to(tl.float32, bitcast=True)


@triton.jit
def _read(ptrs, mask, WAIT: tl.constexpr):
    if WAIT:
        return _poll(ptrs, mask)
    return tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg")


@triton.jit
def gather(PART, rows, row_ok, NQ, NQ_POW2: tl.constexpr, WAIT: tl.constexpr):
    """The rows' NQ partials (ROWS, NQ_POW2; 0 past NQ and M), with WAIT once all are published.

    Read from L2 (L1 is not coherent). The loop never runs again, as every slot read is
    published; it is there for the compiler: a tile that leaves a loop keeps its small layout,
    where one read straight into the computation was laid out after the chunk and went through
    shared memory, which made the kernels many times slower (Triton 3.6)."""
    qs = tl.arange(0, NQ_POW2)
    ptrs = PART + rows[:, None] * NQ + qs[None, :]
    mask = row_ok[:, None] & (qs < NQ)[None, :]
    parts = _read(ptrs, mask, WAIT)
    while tl.max(tl.where(parts == UNSET, 1, 0)) > 0:
        parts = _read(ptrs, mask, WAIT)
    return parts


#: 32-bit registers of an SM: 64K on every NVIDIA GPU since Volta.
REGS_PER_SM = 65536
#: Most warps a split keeps resident per SM (GRID_MULT · num_warps): every NVIDIA GPU since
#: Volta holds 48 or 64, and each thread keeps at least 64 registers.
MAX_RESIDENT_WARPS = 32


def lanes(m: int, rows: int, chunks: int, slots: int) -> int:
    """Lanes of the grid: as many as fit beside each other in `slots` resident programs, each
    taking `chunks` programs; never more than there are row blocks."""
    return max(1, min(slots // chunks, triton.cdiv(m, rows)))


def lane_count(x: torch.Tensor, config: KernelConfig) -> int:
    """Lanes of `config`'s split of the rows of x (M x N): GRID_MULT programs per SM."""
    m, n = x.shape
    slots = config.GRID_MULT * sm_count(x.device)
    return lanes(m, config.ROWS, triton.cdiv(n, config.BLOCK_N), slots)


def resident_options(config: KernelConfig) -> dict[str, int]:
    """Launch options that let GRID_MULT programs of `config` reside on an SM at once: the
    registers per thread capped (maxnreg, a multiple of the allocation granule of 8) where the
    compiler could otherwise take more. The kernels' shared memory (a few reduction scratch
    words) never limits it."""
    per_sm = config.GRID_MULT
    cap = REGS_PER_SM // (per_sm * config.num_warps * 32) // 8 * 8
    return {"maxnreg": cap} if per_sm > 1 and cap < 255 else {}


def phases(chunks: int, sms: int, steps: int) -> tuple[int, ...]:
    """The launches of a kernel whose rows agree `steps` times: one (PHASE 0, waiting at each
    step) where the lane is resident at once, else one per step (PHASE 1 … steps + 1)."""
    if chunks <= sms and not interpreting():
        return (0,)
    return tuple(range(1, steps + 2))


def launches(kernel: Any, x: torch.Tensor, config: KernelConfig, steps: int, *args: Any,
             **meta: Any) -> tuple[torch.Tensor, tuple[Launch, ...]]:
    """The partial slots (allocated and set to UNSET here) and the launches, one per phase,
    of a cooperative `kernel` over the rows of x (M x N) as `config` splits them.

    The kernel takes the `steps` partial buffers (M x Q fp32, one per agreement) and Q first,
    then `args`; BLOCK_N, ROWS, NQ_POW2 and PHASE, then `meta`, as keywords.
    """
    m, n = x.shape
    block, rows = config.BLOCK_N, config.ROWS
    chunks = triton.cdiv(n, block)
    parts = torch.full((steps, m, chunks), UNSET.value, dtype=torch.float32, device=x.device)
    grid = (lane_count(x, config) * chunks,)
    return parts, tuple(
        Launch(kernel, grid, (*parts, chunks, *args),
               {"BLOCK_N": block, "ROWS": rows, "NQ_POW2": next_pow2(chunks), "PHASE": phase,
                **meta, **launch_options(config), **resident_options(config)})
        for phase in phases(chunks, sm_count(x.device), steps))
