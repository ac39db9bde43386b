"""RMSNorm forward as a tuning target: inputs, float64 reference; the family's row-tiling,
persistent-grid and cooperative-split space and default, which add + norm and quant share.

Not hashed (see `kerneltune.kernels`): the device code is in `kerneltune.kernels.rmsnorm_fwd`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch

from kerneltune.kernels import rmsnorm_fwd as device_code
from kerneltune.kernels._config import ForwardConfig, RowTilingConfig
from kerneltune.kernels._coop import MAX_RESIDENT_WARPS, resident_options
from kerneltune.kernels._spec import (
    MAX_BLOCK_ELEMS,
    MIN_ELEMS_PER_THREAD,
    MIN_LOOP_BLOCK,
    NUM_STAGES,
    NUM_WARPS,
    Inputs,
    KernelSpec,
    Outputs,
    Problem,
    generator,
    next_pow2,
    normal,
    pow2_range,
    shared_memory_per_sm,
)
from kerneltune.kernels.rmsnorm_fwd import rmsnorm_fwd

ROWS_CHOICES = (1, 2, 4, 8, 16)
#: Most elements each thread holds: what fits its registers beside the weight chunk.
MAX_ELEMS_PER_THREAD = 64
#: Most programs a row is split over (COOP): a lane of that many must be resident at once, at
#: one program per SM or more; datacenter GPUs have more SMs than this.
MAX_COOP = 64
#: Chunk of the default cooperative split: 8K elements at 8 warps, measured best or close to it
#: for a few long rows.
COOP_BLOCK = 8192
#: A split's shape: (BLOCK_N, ROWS, num_warps, GRID_MULT, num_stages).
Split = tuple[int, int, int, int, int]
#: Splits of the register prefetch (one stage) that the forward ran fastest with at long rows of
#: many rows, where a short search had not found them; the last two, several programs per SM,
#: gain most at the longest rows.
PIPELINED_SPLITS: tuple[Split, ...] = (
    (8192, 2, 8, 1, 1), (16384, 1, 16, 1, 1), (8192, 1, 8, 1, 1), (4096, 1, 4, 3, 1),
    (2048, 1, 4, 4, 1))
#: Splits of one row a block whose next rows Triton's pipeliner loads ahead (num_stages > 1,
#: `kerneltune.kernels._coop_row`), fastest first: at long rows they beat the unstaged splits
#: for the forward and quant alike, the forward coming close to copy speed.
STAGED_SPLITS: tuple[Split, ...] = (
    (8192, 1, 8, 2, 3), (16384, 1, 8, 1, 3), (4096, 1, 4, 4, 3), (8192, 1, 8, 2, 4),
    (16384, 1, 8, 1, 4))
#: Shared memory a split's stages may take on one SM (GRID_MULT programs, each num_stages - 1
#: chunks of x: Triton's pipeliner keeps one buffer fewer than its stages, so 16 KiB a program
#: of 4K bf16 chunks at three stages, as compiled by Triton 3.6 and 3.9). More could leave a
#: lane's programs unable to reside at once, and a split whose programs wait for each other
#: would then hang.
MAX_STAGED_BYTES_PER_SM = 128 * 1024
#: What an SM's shared memory keeps beside the stages (each program's reduction scratch), on a
#: GPU with less than `MAX_STAGED_BYTES_PER_SM` and this (an L4 or an RTX 4090: 100 KiB).
STAGED_MARGIN_BYTES = 32 * 1024
#: The default splits rows that all take at most this many programs (about two per SM of a
#: large GPU) over `COOP_BLOCK` chunks of one row, and longer rows from `LONG_ROWS` on, at any
#: M, as the kernel's `long_row_split` says.
COOP_DEFAULT_PROGRAMS = 256
#: Programs per SM of a split or a persistent grid (GRID_MULT;
#: `kerneltune.kernels._coop.resident_options`). 6, 8 and 12 are for quant's splits: six 4K
#: chunks or eight 2K of two warps, and twelve 2K of one warp, whose reductions stay within a
#: warp (`kerneltune.kernels.rmsnorm_quant_spec`). Not 5: an SM's registers are four quarters
#: of 16K, each holding whole warps, and the registers capped for five programs of two warps
#: (ten warps, 200 registers a thread) fit only eight of the ten warps; a lane not all resident
#: waits for its other programs. Every product of these with 1-16 warps fills the quarters
#: alike or leaves them uncapped.
GRID_MULTS = (1, 2, 3, 4, 6, 8, 12)
#: Where the looped kernel stops being the best default beyond a few rows: from here on, every
#: forward and quant key searched (bf16, Hopper) had a split faster than it.
LONG_ROWS = 65536
#: A whole row on a persistent grid, as (programs per SM, then the default's warps and rows a
#: program scaled by these factors): what a kernel that runs one tries early
#: (`RowTiled.persistent_candidates`).
Persistent = tuple[int, float, float]
#: Most elements a thread of a persistent grid holds where its registers are capped: at 64
#: (three programs of 8192 at 4 warps, 168 registers) quant's fp8 ran far slower than its int8
#: with Triton 3.6.
PERSISTENT_CAPPED_ELEMS = 32
#: The forward's persistent candidates, fastest first. At a few hundred rows or fewer a program
#: has one row block; what counts is that it loads the weight with its rows, not after their
#: sum, and one row a program at two per SM beat the tuned picks. At a few thousand rows of
#: 2K-8K elements three or four programs per SM win a little; with more rows nothing did.
FORWARD_PERSISTENT: tuple[Persistent, ...] = (
    (2, 1, 0.5), (4, 1, 1), (3, 1, 1), (4, 1, 0.5), (2, 2, 1), (4, 0.5, 1))


def rmsnorm_fwd_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch in float64, with the one intermediate rounding the semantics prescribe."""
    x64 = x.double()
    r = torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    if offset != 0.0:
        y = x64 * r * (offset + weight.double())
    else:
        y = weight.double() * (x64 * r).to(x.dtype).double()
    return y, r.squeeze(-1)


# ------------------------------------------------------- row tiling shared by the family


def row_tiling_space(problem: Problem) -> dict[str, list]:
    """The row-tiling space of the family's one-launch kernels (constraints: `valid_row_tiling`)."""
    return {
        "BLOCK_N": pow2_range(16, max(16, min(next_pow2(problem.n), 65536))),
        "SINGLE": [True, False],
        "ROWS": [r for r in ROWS_CHOICES if r <= next_pow2(problem.m)],
        "EVICT": [True, False],
        "num_warps": list(NUM_WARPS),
        "num_stages": list(NUM_STAGES),
    }


def valid_row_tiling(problem: Problem, config: RowTilingConfig) -> bool:
    """Constraints of the (BLOCK_N, SINGLE, ROWS, num_warps, num_stages) row-tiling space.

    SINGLE needs the row block to cover N; looping needs more than one chunk of at least
    `MIN_LOOP_BLOCK` elements and one row per program (several rows only pay off for short
    rows, which never loop); pipelining stages only matter in a loop; a program's register
    block is bounded (larger ones spill); each thread holds 8 to 64 elements (at least one
    16-byte vector, at most what fits its registers) unless the block is one warp's.
    """
    block, rows, warps = config.BLOCK_N, config.ROWS, config.num_warps
    npow = max(16, next_pow2(problem.n))
    if config.SINGLE:
        if block != npow or config.num_stages != 1:
            return False
    elif not MIN_LOOP_BLOCK <= block < problem.n or rows != 1:
        return False
    elems = block * rows
    if elems > MAX_BLOCK_ELEMS * (2 if config.SINGLE else 1):
        return False
    if rows > 1 and rows * problem.n > 16384:
        return False
    return threads_fit(elems, warps)


def threads_fit(elems: int, warps: int) -> bool:
    """Whether a block of `elems` gives each of `warps` warps' threads 8 to 64 elements (any
    block fits a single warp from below: tiny rows)."""
    per_thread = elems // (32 * warps)
    return (warps == 1 or per_thread >= MIN_ELEMS_PER_THREAD) and per_thread <= MAX_ELEMS_PER_THREAD


def staged_bytes_per_sm() -> int:
    """Shared memory a split's stages may take on one SM of this machine's GPU:
    `MAX_STAGED_BYTES_PER_SM`, less where its SMs have less (without a GPU, the full budget)."""
    smem = shared_memory_per_sm()
    if smem is None:
        return MAX_STAGED_BYTES_PER_SM
    return min(MAX_STAGED_BYTES_PER_SM, smem - STAGED_MARGIN_BYTES)


def valid_coop(problem: Problem, config: RowTilingConfig, staged: bool = False) -> bool:
    """Constraints of a cooperative split (COOP): 2 to `MAX_COOP` chunks of at least
    `MIN_LOOP_BLOCK` elements; the register blocks of the GRID_MULT programs an SM holds at
    most twice `MAX_BLOCK_ELEMS` (as one whole row's), in at most `MAX_RESIDENT_WARPS` warps;
    one stage, unless the kernel's split loads its rows ahead through shared memory (`staged`)
    and takes one row a block, whose stages fit `staged_bytes_per_sm`."""
    block, rows, warps = config.BLOCK_N, config.ROWS, config.num_warps
    per_sm, stages = config.GRID_MULT, config.num_stages
    if stages > 1 and not (staged and rows == 1 and per_sm * (stages - 1) * block
                           * problem.itemsize <= staged_bytes_per_sm()):
        return False
    return (not config.SINGLE and per_sm in GRID_MULTS
            and block >= MIN_LOOP_BLOCK and 2 <= -(-problem.n // block) <= MAX_COOP
            and per_sm * block * rows <= 2 * MAX_BLOCK_ELEMS
            and per_sm * warps <= MAX_RESIDENT_WARPS and threads_fit(block * rows, warps))


def valid_persistent(problem: Problem, config: RowTilingConfig) -> bool:
    """Constraints of a whole row on a persistent grid (GRID_MULT > 1 without COOP), beside the
    row tiling's: one block (SINGLE); GRID_MULT programs per SM in at most
    `MAX_RESIDENT_WARPS` warps, their row blocks (each program holds two) at most twice
    `MAX_BLOCK_ELEMS` in all, as a split's; more than `PERSISTENT_CAPPED_ELEMS` elements a
    thread only where the registers are not capped."""
    per_sm, warps = config.GRID_MULT, config.num_warps
    elems = config.BLOCK_N * config.ROWS
    return (config.SINGLE and per_sm in GRID_MULTS
            and per_sm * warps <= MAX_RESIDENT_WARPS and per_sm * elems <= 2 * MAX_BLOCK_ELEMS
            and (elems // (32 * warps) <= PERSISTENT_CAPPED_ELEMS
                 or not resident_options(config)))


class RowTiled(KernelSpec):
    """A kernel of the family tiled as the forward is: one program per row block (the row
    tiling), whole rows on a persistent grid where the kernel has one (GRID_MULT > 1), or a row
    split over cooperating programs (COOP); its space, constraints and default."""

    config_type: ClassVar[type[RowTilingConfig]] = RowTilingConfig

    #: The splits a search tries early (`candidates`).
    split_candidates: ClassVar[tuple[Split, ...]] = PIPELINED_SPLITS
    #: The default split of rows from `long_rows` elements on (for the forward's unstaged
    #: splits, the best of the candidates at every such key of 256 rows or more).
    long_row_split: ClassVar[Split] = (8192, 2, 8, 1, 1)
    long_rows: ClassVar[int] = LONG_ROWS
    #: Whether the kernel's split of one row a block loads its rows ahead through shared
    #: memory (num_stages > 1, `valid_coop`).
    staged_splits: ClassVar[bool] = False
    #: Whether the kernel runs a whole row on a persistent grid (`valid_persistent`), and the
    #: default's row on one that a search tries early.
    persistent: ClassVar[bool] = False
    persistent_candidates: ClassVar[tuple[Persistent, ...]] = ()

    def space(self, problem: Problem) -> dict[str, list]:
        return {**row_tiling_space(problem), "COOP": [False, True], "GRID_MULT": list(GRID_MULTS)}

    def valid(self, problem: Problem, config: RowTilingConfig) -> bool:
        if config.COOP:
            return valid_coop(problem, config, self.staged_splits)
        if config.GRID_MULT > 1 and not (
                self.persistent and valid_persistent(problem, config)):
            return False
        return valid_row_tiling(problem, config)

    def default(self, problem: Problem) -> RowTilingConfig:
        """The row tiling's default; few long rows split over programs of `COOP_BLOCK`, very
        long ones as `long_row_split` says (unstaged where its stages do not fit; the looped
        kernel where the split does not)."""
        config = self.config_type(**default_row_tiling(problem))
        if config.SINGLE:
            return config
        chunks = -(-problem.n // COOP_BLOCK)
        if 2 <= chunks <= MAX_COOP and problem.m * chunks <= COOP_DEFAULT_PROGRAMS:
            shape = (COOP_BLOCK, 1, 8, 1, 1)
        elif problem.n >= self.long_rows:
            shape = self.long_row_split
        else:
            return config
        # Unstaged where its stages do not fit (4-byte x, or a GPU with less shared memory).
        return next(iter(self._splits(problem, config, [shape, (*shape[:4], 1)])), config)

    def candidates(self, problem: Problem) -> list[RowTilingConfig]:
        """The `one_row_launch`; for a default that loops over the row, its `thin_loop` (one
        config, tried before the splits, which would otherwise take the trials that could
        reach it); the `split_candidates` that are valid for this problem, for rows longer
        than one chunk of the default split (shorter ones are best whole, in one program);
        then, for a default that holds the whole row, the `persistent_candidates`."""
        default = self.default(problem)
        splits = ([] if problem.n <= COOP_BLOCK
                  else self._splits(problem, default, self.split_candidates))
        one_row = self.one_row_launch(problem)
        if not default.SINGLE:
            thin = [] if default.COOP else self.thin_loop(problem, default)
            return [*one_row, *thin, *splits]
        found = [*one_row, *splits]
        warps, rows = default.num_warps, default.ROWS
        return [*found, *self.valid_variants(
            problem, default.replace(EVICT=True), ("GRID_MULT", "num_warps", "ROWS"),
            [(g, max(1, int(warps * fw)), max(1, int(rows * fr)))
             for g, fw, fr in self.persistent_candidates])]

    def one_row_launch(self, problem: Problem) -> list[RowTilingConfig]:
        """The launch of the peers that hold a row in one program (one-row Triton, Liger): the
        whole row, one row a program, no eviction hint, in the fewest warps from 4 that hold
        it (none where no block of registers does). A short search from the default had not
        reached it where the peers were faster; tried first, it brought add + norm at long
        rows level with Liger."""
        whole = self.default(problem).replace(
            BLOCK_N=max(16, next_pow2(problem.n)), SINGLE=True, ROWS=1, EVICT=False,
            num_stages=1, COOP=False, GRID_MULT=1)
        return self.valid_variants(problem, whole, ("num_warps",), [(4,), (8,), (16,), (32,)])[:1]

    def thin_loop(self, problem: Problem, loop: RowTilingConfig) -> list[RowTilingConfig]:
        """The loop of `loop` over chunks of one 16-byte vector a thread in 32 warps (8K of
        bf16): as many loads in flight a chunk as its 16K chunks in 8 warps give, spread over
        four times the warps. At long rows it measured the best of all the loop's configs on
        one GPU, where a search had kept the default, and tied or lost on another: a
        candidate, kept only where it wins."""
        vector = 16 // problem.itemsize
        return self.valid_variants(problem, loop, ("BLOCK_N", "num_warps"),
                                   [(32 * 32 * vector, 32)])

    def _splits(self, problem: Problem, base: RowTilingConfig,
                shapes: Sequence[Split]) -> list[RowTilingConfig]:
        """`base` split as each shape of `shapes` says, where valid."""
        split = base.replace(COOP=True, SINGLE=False, EVICT=True)
        return self.valid_variants(
            problem, split, ("BLOCK_N", "ROWS", "num_warps", "GRID_MULT", "num_stages"), shapes)


def default_row_tiling(problem: Problem) -> dict[str, int | bool]:
    """The heuristic: the whole row in registers up to 16K elements, 16K chunks beyond (measured
    best for the loop at long rows); warps grow with the block; short rows pack several per
    program."""
    npow = max(16, next_pow2(problem.n))
    single = npow <= 16384
    block = npow if single else 16384
    rows = 1
    while single and rows < 16 and rows * 2 * npow <= 2048 and rows * 2 <= next_pow2(problem.m):
        rows *= 2
    elems = block * rows
    warps = 1 if elems <= 256 else 2 if elems <= 512 else 4 if elems <= 2048 else 8
    return {"BLOCK_N": block, "SINGLE": single, "ROWS": rows, "EVICT": True,
            "num_warps": warps, "num_stages": 1}


class WholeRows(KernelSpec):
    """A kernel of the family with the row tiling (whole rows or looped, rows per program) and a
    persistent grid of whole rows (GRID_MULT > 1), and no row split (COOP is always False): its
    space, constraints (`valid_row_tiling`, `valid_persistent`) and default (the row tiling's
    heuristic, one program per row block)."""

    config_type: ClassVar[type[RowTilingConfig]] = RowTilingConfig

    def space(self, problem: Problem) -> dict[str, list]:
        return {**row_tiling_space(problem), "COOP": [False], "GRID_MULT": list(GRID_MULTS)}

    def valid(self, problem: Problem, config: RowTilingConfig) -> bool:
        if config.COOP or (config.GRID_MULT > 1 and not valid_persistent(problem, config)):
            return False
        return valid_row_tiling(problem, config)

    def default(self, problem: Problem) -> RowTilingConfig:
        return RowTilingConfig(**default_row_tiling(problem))


class RMSNormFwd(RowTiled):
    """The forward: the family's tiling, and when a whole row's program releases the next grid
    of a dependent launch (LATE_RELEASE: as it exits, not after its loads; the loop and the
    split have no choice)."""

    name = "rmsnorm_fwd"
    kernel_module = device_code
    config_type = ForwardConfig
    options: ClassVar[dict[str, tuple[float, ...]]] = {"offset": (0.0, 1.0)}
    row_inputs: ClassVar[tuple[str, ...]] = ("x",)
    persistent: ClassVar[bool] = True
    persistent_candidates: ClassVar[tuple[Persistent, ...]] = FORWARD_PERSISTENT
    staged_splits: ClassVar[bool] = True
    split_candidates: ClassVar[tuple[Split, ...]] = (*STAGED_SPLITS, *PIPELINED_SPLITS)
    #: Two programs per SM of 8K chunks, three stages: level with the best split at long rows
    #: of thousands of rows, near copy speed, and what tuning kept at every such key (fewer
    #: rows preferred smaller chunks).
    long_row_split: ClassVar[Split] = (8192, 1, 8, 2, 3)

    def space(self, problem: Problem) -> dict[str, list]:
        return {**super().space(problem), "LATE_RELEASE": [False, True]}

    def valid(self, problem: Problem, config: ForwardConfig) -> bool:
        late = config.LATE_RELEASE
        return super().valid(problem, config) and (
            not late or (config.SINGLE and not config.COOP))

    def one_row_launch(self, problem: Problem) -> list[ForwardConfig]:
        """The family's, released as the program exits, as the peers' programs are: released
        after its loads it trailed one-row Triton at many mid-length rows; released late, it
        is level with it there."""
        return [c.replace(LATE_RELEASE=True) for c in super().one_row_launch(problem)]

    def upgrade(self, problem: Problem, data: Mapping[str, Any]) -> dict[str, Any]:
        """The family's; configs of the two-launch row split that the cooperative one replaced
        (SPLIT > 1) have no reading."""
        data = dict(data)
        if data.pop("SPLIT", 1) != 1:
            raise ValueError(f"{self.name}: the two-launch row split (SPLIT) is gone")
        return super().upgrade(problem, data)

    def make_inputs(self, problem: Problem, seed: int, device: str | torch.device) -> Inputs:
        g = generator(seed, device)
        x = normal(g, problem.m, problem.n, dtype=problem.torch_dtype)
        w = normal(g, problem.n, dtype=problem.torch_dtype, mean=1.0, std=0.25)
        return {"x": x, "weight": w, "eps": 1e-6, "offset": float(problem.option("offset", 0.0))}

    def run(self, inputs: Inputs, config: ForwardConfig) -> Outputs:
        return rmsnorm_fwd(inputs["x"], inputs["weight"], inputs["eps"], inputs["offset"], config)

    def reference(self, inputs: Inputs) -> Outputs:
        return rmsnorm_fwd_ref(inputs["x"], inputs["weight"], inputs["eps"], inputs["offset"])

    def bytes_moved(self, problem: Problem) -> int:
        m, n, s = problem.m, problem.n, problem.itemsize
        return 2 * m * n * s + n * s + 4 * m


SPEC = RMSNormFwd()
