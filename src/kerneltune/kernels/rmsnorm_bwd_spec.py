"""RMSNorm backward as a tuning target: inputs, float64 reference with fp32 error bounds for the
check, persistent-grid space, default config.

Not hashed (see `kerneltune.kernels`): the device code is in `kerneltune.kernels.rmsnorm_bwd`.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import triton

from kerneltune.kernels import rmsnorm_bwd as device_code
from kerneltune.kernels._config import BackwardConfig
from kerneltune.kernels._coop import MAX_RESIDENT_WARPS
from kerneltune.kernels._spec import (
    MIN_ELEMS_PER_THREAD,
    MIN_LOOP_BLOCK,
    NUM_STAGES,
    NUM_WARPS,
    SLACK,
    UNIT_ROUNDOFF,
    Inputs,
    KernelSpec,
    Outputs,
    Problem,
    generator,
    next_pow2,
    normal,
    pow2_range,
    reference_peaks,
    row_blocks,
    rows_named,
    sm_count,
    within_one_rounding,
)
from kerneltune.kernels.rmsnorm_bwd import REDUCE_MAX_ROWS, REDUCE_MIN_ROWS, rmsnorm_bwd

ROWS_CHOICES = (1, 2, 4, 8, 16)
GRID_MULTS = (1, 2, 4, 8)
DW_MODES = ("registers", "global", "columns", "split")
#: Most programs a row is split over (DW = "split"): each lane of that many must be resident
#: at once, at one program per SM or more; datacenter GPUs have more SMs than this.
MAX_SPLIT = 64
#: fp32 values one thread may keep live before the compiler spills (255 registers, less the
#: addresses and temporaries).
MAX_ELEMS_PER_THREAD = 128
#: Shared memory a pipelined config may use for its staged x and dy chunks (H100: 227 KB).
MAX_STAGED_BYTES = 160 * 1024
#: (BLOCK_N, ROWS, num_warps, EVICT, GRID_MULT) of the row splits a search tries early
#: (`candidates`): the fastest measured at long rows from a few hundred rows to many thousands;
#: the last two, several programs per SM, faster still at the longest rows.
SPLIT_CANDIDATES = ((8192, 1, 16, False, 1), (4096, 2, 8, False, 1), (4096, 2, 8, True, 1),
                    (2048, 1, 4, False, 4), (4096, 1, 8, False, 2))
#: Rows a search does not try to split first: up to here the whole row in registers measured
#: best (see `RMSNormBwd.default`).
WHOLE_ROWS = 8192
#: Most BLOCK_N chunks a looped config takes per row (more for rows beyond 128 · 4096, so that
#: 4K chunks always qualify): smaller chunks only add loop overhead, and the cap keeps the fp32
#: error of the row sum (see `row_sum_depth`) small.
MAX_CHUNKS = 128


def split_candidates(spec: KernelSpec, problem: Problem) -> list[BackwardConfig]:
    """The `SPLIT_CANDIDATES` that are valid for a backward `spec` (its configs
    `BackwardConfig`s) at this problem, for rows of more than `WHOLE_ROWS` elements: its
    default made a split of one program per SM, with each named variant applied."""
    if problem.n <= WHOLE_ROWS:
        return []
    base = spec.default(problem).replace(SINGLE=False, PREFETCH=False, DW="split",
                                         GRID_MULT=1, num_stages=1)
    return spec.valid_variants(
        problem, base, ("BLOCK_N", "ROWS", "num_warps", "EVICT", "GRID_MULT"),
        SPLIT_CANDIDATES)


def dw_terms_ref(dy: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, offset: float
                 ) -> torch.Tensor:
    """The float64 terms dy · x̂ᵥ whose column sums are dw (x̂ᵥ: what the forward multiplied w by).

    In llama mode x̂ᵥ is the fp32 product x · r rounded to x.dtype, exactly as the forward
    computes it; in gemma mode x̂ = x · r unrounded.
    """
    r = rstd.double()[:, None]
    if offset != 0.0:
        xhat_v = x.double() * r
    else:
        xhat_v = (x.float() * rstd.float()[:, None]).to(x.dtype).double()
    return dy.double() * xhat_v


def rmsnorm_bwd_ref(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
                    offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The closed form in float64 from the same saved rstd: (dx, dw), both float64."""
    r = rstd.double()[:, None]
    xhat = x.double() * r
    g = dy.double() * (weight.double() + offset)
    dx = r * (g - xhat * (g * xhat).mean(-1, keepdim=True))
    return dx, dw_terms_ref(dy, x, rstd, offset).sum(0)


def gamma(depth: int) -> float:
    """γ_L = L·u / (1 − L·u) for fp32: the relative error bound of L chained roundings."""
    lu = depth * UNIT_ROUNDOFF[torch.float32]
    return lu / (1.0 - lu)


def max_chunks(n: int) -> int:
    """Most BLOCK_N chunks a looped config may take for rows of n elements."""
    return max(MAX_CHUNKS, triton.cdiv(n, 4096))


def row_sum_depth(n: int) -> int:
    """Most fp32 roundings a row sum Σ_N g·x̂ goes through, over every config of the space:
    its chunks accumulated in sequence (looped), then a tree over the block."""
    return min(max_chunks(n), triton.cdiv(n, 16)) + max(16, next_pow2(n)).bit_length()


def fewest_programs_per_row_block(n: int, sms: int) -> int:
    """Fewest programs among which any config of the space deals the row blocks: SMs, or
    ⌊SMs / Q⌋ lanes where a row can be split over Q programs."""
    most_split = min(MAX_SPLIT, triton.cdiv(n, MIN_LOOP_BLOCK))
    return sms if most_split < 2 else max(1, sms // most_split)


def split_elements(config: BackwardConfig) -> int:
    """Most elements of a split's row block: 16K, and 8K in all for the GRID_MULT > 1 programs
    of an SM, whose registers are capped (two rows of 4K at two per SM spilled and ran several
    times slower than at one)."""
    per_sm = config.GRID_MULT
    return 16384 if per_sm == 1 else 8192 // per_sm


def dw_summation_depth(m: int, n: int, sms: int) -> int:
    """Most fp32 roundings any dw value goes through, over every config of the space.

    A program takes ⌈blocks / GRID⌉ ≤ ⌈M / P⌉ row blocks, P the fewest programs among which the
    blocks are dealt (`fewest_programs_per_row_block`; GRID ≥ P unless every block has its own
    program), each summed over ≤ 16 rows as a tree (depth 4); the partials are summed
    over ≤ max(GRID_MULT) · SMs programs in columns of at least REDUCE_MIN_ROWS accumulators
    (fewer partials than that take one step), then a tree over at most REDUCE_MAX_ROWS;
    the products dy · x̂ (and x · r in gemma mode) add two.
    """
    per_program = (math.ceil(m / fewest_programs_per_row_block(n, sms))
                   + math.ceil(math.log2(max(ROWS_CHOICES))))
    reduce = (math.ceil(max(GRID_MULTS) * sms / REDUCE_MIN_ROWS)
              + math.ceil(math.log2(REDUCE_MAX_ROWS)))
    return per_program + reduce + 2


def fp32_error_bounds(inputs: Inputs, sms: int, rows: slice = slice(None)
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Worst-case error of the kernel's fp32 arithmetic, per element of dx at `rows` (all by
    default) and of dw over those rows' terms (float64; the sum over blocks of rows is the bound
    over all of them).

    dx = r · (g − x̂ · c), c = mean(g · x̂): g carries 2 roundings (w + offset, the product), x̂
    one, c those of its L_N-deep row sum plus the products and the division, the rest 4 more;
    to first order (Higham, Accuracy and Stability, §3.1 and §4.2, γ_L = L·u / (1 − L·u))

        |Δdx| ≤ γ_{L_N + 8} · r · (|g| + 2 · |x̂| · mean|g · x̂|)

    (|c| ≤ mean|g · x̂|). The term matters where g − x̂ · c cancels, which a bound relative to
    |dx| alone cannot cover. dw = Σ_M dy · x̂ᵥ with every term through at most L_M roundings:

        |Δdw| ≤ γ_{L_M} · Σ_M |dy · x̂ᵥ|

    Both are worst cases over summation orders, so no config fails them by rounding alone,
    while a lost or doubled row (an error of about one term, Σ|terms| / M, in dw) exceeds the
    dw bound as long as M · γ_{L_M} ≪ 1, i.e. up to millions of rows. L_M counts every row,
    also where `rows` are some of them.
    """
    x, dy, rstd, offset = (inputs["x"].detach(), inputs["dy"].detach(), inputs["rstd"].detach(),
                           inputs["offset"])
    m, n = x.shape
    x, dy, rstd = x[rows], dy[rows], rstd[rows]
    r = rstd.double()[:, None]
    xhat = x.double() * r
    g = dy.double() * (inputs["weight"].detach().double() + offset)
    mean_abs = (g * xhat).abs().mean(-1, keepdim=True)
    dx_bound = gamma(row_sum_depth(n) + 8) * r * (g.abs() + 2 * xhat.abs() * mean_abs)
    abs_terms = dw_terms_ref(dy, x, rstd, offset).abs().sum(0)
    return dx_bound, gamma(dw_summation_depth(m, n, sms)) * abs_terms


class RMSNormBwd(KernelSpec):
    name = "rmsnorm_bwd"
    kernel_module = device_code
    config_type = BackwardConfig
    options: ClassVar[dict[str, tuple[float, ...]]] = {"offset": (0.0, 1.0)}
    row_inputs: ClassVar[tuple[str, ...]] = ("x", "dy", "rstd")
    summed_outputs: ClassVar[tuple[int, ...]] = (1,)  # dw

    def space(self, problem: Problem) -> dict[str, list]:
        return {
            "BLOCK_N": pow2_range(16, max(16, min(next_pow2(problem.n), 65536))),
            "SINGLE": [True, False],
            "PREFETCH": [False, True],
            "DW": list(DW_MODES),
            "ROWS": [r for r in ROWS_CHOICES if r <= next_pow2(problem.m)],
            "GRID_MULT": list(GRID_MULTS),
            "EVICT": [True, False],
            "num_warps": list(NUM_WARPS),
            "num_stages": list(NUM_STAGES),
        }

    def valid(self, problem: Problem, config: BackwardConfig) -> bool:
        """SINGLE needs the block to cover N exactly once and a whole-row dw partial; looping
        needs more than one chunk of at least `MIN_LOOP_BLOCK` (at most `max_chunks`), one row
        per program and a global or per-column partial; a split row takes 2 to `MAX_SPLIT`
        programs, GRID_MULT of them per SM in at most `MAX_RESIDENT_WARPS` warps, and no
        pipelining stages (it loads ahead itself), with a block of at most `split_elements`;
        what a program keeps live (x and dy blocks, w, the dw or pass-1 accumulator) must fit
        its threads' registers (whole rows of 16K elements do, at 32 warps); every warp needs
        work; pipelining stages must fit shared memory; several rows per program only for short
        rows.
        """
        block, rows = config.BLOCK_N, config.ROWS
        stages = config.num_stages
        single, regs = config.SINGLE, config.DW == "registers"
        prefetch = config.PREFETCH
        if config.DW not in DW_MODES or config.GRID_MULT not in GRID_MULTS:
            return False
        if prefetch and not single:
            return False
        if config.DW == "split":
            return (not single and MIN_LOOP_BLOCK <= block < problem.n
                    and triton.cdiv(problem.n, block) <= MAX_SPLIT
                    and config.GRID_MULT * config.num_warps <= MAX_RESIDENT_WARPS
                    and stages == 1 and rows * block <= split_elements(config)
                    and self._fits(problem, config))
        if single:
            if block != max(16, next_pow2(problem.n)) or stages > 2 or config.DW == "columns":
                return False
        elif (not MIN_LOOP_BLOCK <= block < problem.n or rows != 1 or regs
              or triton.cdiv(problem.n, block) > max_chunks(problem.n)):
            return False
        if rows > 1 and rows * problem.n > 16384:
            return False
        return self._fits(problem, config)

    @staticmethod
    def _fits(problem: Problem, config: BackwardConfig) -> bool:
        """What a program keeps live fits its threads' registers, its pipelining stages fit
        shared memory, and every warp has work."""
        block, rows = config.BLOCK_N, config.ROWS
        warps, stages = config.num_warps, config.num_stages
        single, mode = config.SINGLE, config.DW
        # A block kept as stored takes itemsize / 4 of a register per value.
        stored = 2 * rows * problem.itemsize / 4
        if mode == "split":
            # Three blocks of x and dy as stored (pipelined), w and the dw partial.
            live = (3 * stored + 2) * block
        else:
            # fp32 x and dy; pass 1's accumulator per looped row, or dw's beside a whole row;
            # with PREFETCH the next block as stored.
            accumulator = 1 if single and mode == "registers" else 0 if single else rows
            ahead = stored if config.PREFETCH else 0
            live = (2 * rows + 1 + accumulator + ahead) * block
        if live > MAX_ELEMS_PER_THREAD * 32 * warps:
            return False
        if (stages - 1) * 2 * rows * block * problem.itemsize > MAX_STAGED_BYTES:
            return False
        return warps == 1 or block * rows >= 32 * warps * MIN_ELEMS_PER_THREAD

    def default(self, problem: Problem) -> BackwardConfig:
        """From every valid config timed (bf16) at rows of 1K-16K elements: the whole row in
        registers with the dw partial beside it up to 16K elements (the best at each shape);
        short rows packed to 2K elements per program; 512 elements per warp, at most 16 warps;
        16 warps per SM in all; the next row block prefetched where it fits, without eviction
        hints (clearly faster than without, except at 16K, where it spills). Beyond 16K, the
        row split over 4K chunks, one row a block, two programs per SM: well ahead of two rows
        a block at one per SM and of the column split at long rows of thousands of rows, and
        the best split tried nearly everywhere (the longest rows prefer 8K chunks at 16
        warps). The column split where the split's blocks do not fit registers."""
        npow = max(16, next_pow2(problem.n))
        split = BackwardConfig(BLOCK_N=4096, SINGLE=False, PREFETCH=False, DW="split", ROWS=1,
                               GRID_MULT=2, EVICT=False, num_warps=8, num_stages=1)
        if npow > 16384 and self.valid(problem, split):
            return split
        if npow > 16384:
            return split.replace(DW="columns", EVICT=True, num_stages=2)
        rows = 1
        while rows < 16 and rows * 2 * npow <= 2048 and rows * 2 <= next_pow2(problem.m):
            rows *= 2
        warps = max(1, min(16, npow * rows // 512))
        config = BackwardConfig(
            BLOCK_N=npow, SINGLE=True, PREFETCH=True, DW="registers", ROWS=rows,
            GRID_MULT=max(1, min(max(GRID_MULTS), 16 // warps)), EVICT=False, num_warps=warps,
            num_stages=1)
        if not self.valid(problem, config):  # no room for a second block
            config = config.replace(PREFETCH=False)
        return config

    def candidates(self, problem: Problem) -> list[BackwardConfig]:
        """The `SPLIT_CANDIDATES` that are valid for this problem, for rows of more than
        `WHOLE_ROWS` elements."""
        return split_candidates(self, problem)

    def make_inputs(self, problem: Problem, seed: int, device: str | torch.device) -> Inputs:
        g = generator(seed, device)
        x = normal(g, problem.m, problem.n, dtype=problem.torch_dtype)
        dy = normal(g, problem.m, problem.n, dtype=problem.torch_dtype)
        w = normal(g, problem.n, dtype=problem.torch_dtype, mean=1.0, std=0.25)
        rstd = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-6)  # as the forward saves it
        return {"x": x, "dy": dy, "weight": w, "rstd": rstd,
                "offset": float(problem.option("offset", 0.0))}

    def run(self, inputs: Inputs, config: BackwardConfig) -> Outputs:
        return rmsnorm_bwd(inputs["dy"], inputs["x"], inputs["weight"], inputs["rstd"],
                           inputs["offset"], config)

    def reference(self, inputs: Inputs) -> Outputs:
        """`rmsnorm_bwd_ref` taken `row_blocks` at a time: (dx, dw) in float64. Whole, its
        float64 temporaries (8 GB each at 4096 x 262144) do not fit beside the tuner's inputs
        and graphs on an 80 GB GPU, and the check would fail for want of memory."""
        x, dy, rstd = inputs["x"], inputs["dy"], inputs["rstd"]
        m, n = x.shape
        dx = torch.empty((m, n), dtype=torch.float64, device=x.device)
        dw = torch.zeros((n,), dtype=torch.float64, device=x.device)
        for rows in row_blocks(m, n):
            dx[rows], dw_rows = rmsnorm_bwd_ref(dy[rows], x[rows], inputs["weight"], rstd[rows],
                                                inputs["offset"])
            dw += dw_rows
        return dx, dw

    def check(self, inputs: Inputs, outputs: Outputs, expected: Outputs | None = None
              ) -> str | None:
        """dx and dw within their dtype's rounding plus the kernel's fp32 error bounds, against
        the reference (or `expected`, where given) taken `row_blocks` at a time, as
        `check_by_rows` takes the forward's: no float64 copy of dx or its bound exists whole."""
        if len(outputs) != 2:
            return f"{len(outputs)} outputs, expected 2 (dx, dw)"
        dx, dw = outputs
        x, dy, rstd, weight, offset = (inputs[k] for k in ("x", "dy", "rstd", "weight", "offset"))
        for name, out, dtype in (("dx", dx, x.dtype), ("dw", dw, weight.dtype)):
            if out.dtype != dtype:
                return f"{name}: dtype {out.dtype}, expected {dtype}"
        m, n = x.shape

        def reference(rows: slice) -> tuple[torch.Tensor, torch.Tensor | None]:
            if expected is not None:
                return expected[0][rows], None
            return rmsnorm_bwd_ref(dy[rows], x[rows], weight, rstd[rows], offset)

        blocks = row_blocks(m, n)
        peak = (reference_peaks(reference(rows)[:1] for rows in blocks)[0]
                if len(blocks) > 1 else None)
        dw_ref = torch.zeros((n,), dtype=torch.float64, device=x.device)
        dw_bound = torch.zeros_like(dw_ref)
        sms = sm_count(x.device)
        for rows in blocks:
            dx_ref, dw_rows = reference(rows)
            dx_bound, dw_rows_bound = fp32_error_bounds(inputs, sms, rows)
            why = within_one_rounding(dx[rows], dx_ref.double(), slack=SLACK[dx.dtype],
                                      extra=dx_bound, peak=peak)
            if why:
                return f"dx, {rows_named(rows, m)}: {why}" if peak is not None else f"dx: {why}"
            if dw_rows is not None:
                dw_ref += dw_rows
            dw_bound += dw_rows_bound
        if expected is not None:
            dw_ref = expected[1].double()
        why = within_one_rounding(dw, dw_ref, slack=SLACK[dw.dtype], extra=dw_bound)
        return f"dw: {why}" if why else None

    def bytes_moved(self, problem: Problem) -> int:
        m, n, s = problem.m, problem.n, problem.itemsize
        return 3 * m * n * s + 2 * n * s + 4 * m


SPEC = RMSNormBwd()
