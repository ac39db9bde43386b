"""A cooperative row split (`kerneltune.kernels._coop`) launched as a dependent launch
(`kerneltune.kernels._dependent_launch`), its partial slots filled by a kernel of its own.

`_coop.launches` fills the slots with torch, whose kernel releases nothing, so the split follows
it as an ordinary launch (as a dependent launch behind it, it measured slower). Here a Triton
kernel fills them: it waits for the grid before it (the slots may be memory that grid still
uses), then releases the split at once, which is placed while the fill runs and waits for it
at its own `wait_prior_grid`. This pays for the backward at few rows, where launch latency is
most of its time, and costs nothing measurable at many. The forward kernels still launch
through `_coop.launches`: moving them changes the hash of their device code, which makes every
tuned entry of theirs stale.

Device code: hashed with the kernels that call it (`DEVICE_CODE_FROM`).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from kerneltune.kernels._config import KernelConfig
from kerneltune.kernels._coop import UNSET, lane_count, phases, resident_options
from kerneltune.kernels._dependent_launch import release_next_grid, wait_prior_grid
from kerneltune.kernels._launch import Launch
from kerneltune.kernels._spec import launch_options, next_pow2, sm_count

#: Slots one program of the fill writes.
FILL_BLOCK = 1024


@triton.jit
def fill_unset(PARTS, size, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """PARTS[:size] = UNSET; with PDL, after the grid before it and releasing the next one."""
    wait_prior_grid(PDL)
    release_next_grid(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(PARTS + offs, tl.full([BLOCK], UNSET, tl.float32), mask=offs < size)


def launches(kernel: Any, x: torch.Tensor, config: KernelConfig, steps: int, *args: Any,
             pdl: bool, values: int = 1, **meta: Any) -> tuple[torch.Tensor, tuple[Launch, ...]]:
    """`_coop.launches`, the slots filled by `fill_unset` first and, with `pdl`, every launch
    a dependent one (the kernel takes PDL, and calls `wait_prior_grid` before it reads).

    `values`: partials each chunk publishes per row at each agreement, each into a buffer of
    its own, so the kernel takes steps · values buffers (those of the first agreement first);
    the launches still follow the `steps` agreements (`phases`)."""
    m, n = x.shape
    block, rows = config.BLOCK_N, config.ROWS
    chunks = triton.cdiv(n, block)
    parts = torch.empty((steps * values, m, chunks), dtype=torch.float32, device=x.device)
    fill = Launch(fill_unset, (triton.cdiv(parts.numel(), FILL_BLOCK),), (parts, parts.numel()),
                  {"BLOCK": FILL_BLOCK, "PDL": pdl, "launch_pdl": pdl, "num_warps": 4})
    grid = (lane_count(x, config) * chunks,)
    return parts, (fill, *(
        Launch(kernel, grid, (*parts, chunks, *args),
               {"BLOCK_N": block, "ROWS": rows, "NQ_POW2": next_pow2(chunks), "PHASE": phase,
                "PDL": pdl, "launch_pdl": pdl, **meta, **launch_options(config),
                **resident_options(config)})
        for phase in phases(chunks, sm_count(x.device), steps)))
