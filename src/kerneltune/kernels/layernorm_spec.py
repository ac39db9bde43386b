"""LayerNorm forward and backward as tuning targets: inputs, float64 references with the fp32
error bounds their checks allow, spaces and defaults.

Registered through the entry-point group ``kerneltune.kernels`` (`SPECS`), the way a kernel kept
outside the package joins the registry. Not hashed: the device code is in
`kerneltune.kernels.layernorm` (the forward's hash) and `kerneltune.kernels.layernorm_bwd`
(the backward's).

The forward takes the family's row tiling (`RowTilingConfig`: a whole row in registers or
looped, rows per program, a persistent grid), never a row split; the backward the RMSNorm
backward's config (`BackwardConfig`) with its dw and db partials in registers or in global
memory, or its rows split over cooperating programs (DW = "split", as the RMSNorm backward's),
never prefetched.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import triton

from kerneltune.kernels import layernorm as device_code
from kerneltune.kernels import layernorm_bwd as backward_code
from kerneltune.kernels._config import BackwardConfig, RowTilingConfig
from kerneltune.kernels._coop import MAX_RESIDENT_WARPS
from kerneltune.kernels._spec import (
    MIN_ELEMS_PER_THREAD,
    MIN_LOOP_BLOCK,
    NUM_STAGES,
    NUM_WARPS,
    SLACK,
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
from kerneltune.kernels.layernorm import layernorm_fwd
from kerneltune.kernels.layernorm_bwd import DW_MODES, layernorm_bwd
from kerneltune.kernels.rmsnorm_bwd_spec import (
    GRID_MULTS as BACKWARD_GRID_MULTS,
)
from kerneltune.kernels.rmsnorm_bwd_spec import (
    MAX_ELEMS_PER_THREAD,
    MAX_SPLIT,
    MAX_STAGED_BYTES,
    dw_summation_depth,
    gamma,
    max_chunks,
    row_sum_depth,
    split_candidates,
    split_elements,
)
from kerneltune.kernels.rmsnorm_fwd_spec import ROWS_CHOICES, WholeRows

#: The eps of the tuning inputs: torch.nn.LayerNorm's default.
EPS = 1e-5


def layernorm_fwd_ref(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, mean, rstd) in float64: y = (x − mean) · rstd · w + b with the biased variance."""
    x64 = x.double()
    mean = x64.mean(-1)
    xc = x64 - mean[:, None]
    rstd = torch.rsqrt(xc.pow(2).mean(-1) + eps)
    y = xc * rstd[:, None]
    if weight is not None:
        y = y * weight.double()
    if bias is not None:
        y = y + bias.double()
    return y, mean, rstd


def layernorm_bwd_ref(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None,
                      mean: torch.Tensor, rstd: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dw, db) in float64 from the forward's saved mean and rstd."""
    r = rstd.double()[:, None]
    xhat = (x.double() - mean.double()[:, None]) * r
    dy64 = dy.double()
    wdy = dy64 if weight is None else dy64 * weight.double()
    c1 = (xhat * wdy).mean(-1, keepdim=True)
    c2 = wdy.mean(-1, keepdim=True)
    return (wdy - (xhat * c1 + c2)) * r, (dy64 * xhat).sum(0), dy64.sum(0)


def forward_depth(n: int) -> int:
    """Most fp32 roundings a row sum of the forward goes through over its space: its chunks
    accumulated in sequence (looped, chunks of `MIN_LOOP_BLOCK` or more), then a tree over the
    block."""
    return triton.cdiv(n, MIN_LOOP_BLOCK) + max(16, next_pow2(n)).bit_length()


def forward_error_bounds(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                         eps: float, mean: torch.Tensor, rstd: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Worst-case error of the forward's fp32 arithmetic per element of y, mean and rstd (float64,
    from the float64 `mean` and `rstd` of the rows of x).

    With L = `forward_depth` and γ_k = k·u / (1 − k·u) (Higham, §3.1), to first order::

        |Δmean|        ≤ γ_{L+1} · mean|x|
        |Δrstd| / rstd ≤ γ_{L+4} + Δmean² / (var + eps)      (the centred sum, sqrt, divide)
        |Δy|           ≤ |w| · rstd · |Δmean| + |x̂ · w| · (|Δrstd| / rstd + γ_3) + γ_2 · |b|

    y's term in |b| matters where x̂ · w + b cancels, which a bound relative to |y| alone cannot
    cover; a lost or doubled element moves the mean by |x| / N, beyond γ_{L+1} · mean|x| while
    N · γ_{L+1} ≪ 1."""
    depth = forward_depth(x.shape[-1])
    x64 = x.double()
    xc = x64 - mean[:, None]
    d_mean = gamma(depth + 1) * x64.abs().mean(-1)
    var = xc.pow(2).mean(-1)
    d_rstd = gamma(depth + 4) + d_mean.pow(2) / (var + eps)
    w = weight.double().abs() if weight is not None else x64.new_ones(x.shape[-1])
    xhat_w = (xc * rstd[:, None]).abs() * w
    d_y = w * (rstd * d_mean)[:, None] + xhat_w * (d_rstd[:, None] + gamma(3))
    if bias is not None:
        d_y = d_y + gamma(2) * bias.double().abs()
    return d_y, d_mean, d_rstd * rstd


def backward_error_bounds(inputs: Inputs, sms: int, rows: slice = slice(None)
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Worst-case error of the backward's fp32 arithmetic per element of dx at `rows` (all by
    default), and of dw and db over those rows' terms (float64; the sum over blocks of rows is
    the bound over all of them).

    x̂ = (x − mean) · rstd carries two roundings, of a = |x̂| + rstd · |mean| (the saved mean is
    itself one rounding off the exact one, which a reference from exact statistics does not
    share), w · dy one; c1 and c2 those of their L_N-deep row sums (`row_sum_depth`) plus the
    products and the division; dx four more::

        |Δdx| ≤ γ_{L_N + 8} · rstd · (|w · dy| + 2 · a · mean(a · |w · dy|) + 2 · mean|w · dy|)
        |Δdw| ≤ γ_{L_M + 2} · Σ_M |dy| · a,    |Δdb| ≤ γ_{L_M} · Σ_M |dy|

    with L_M = `dw_summation_depth` (the RMSNorm backward's, whose space includes this one's
    grids, row splits and reduction), counting every row also where `rows` are some of them.

    A split's sums take the same bounds. Its row sums are a tree over each chunk, then one
    over the Q ≤ `MAX_SPLIT` chunk partials in a fixed order: no deeper than a looped row's Q
    chunks added in sequence, which L_N counts, even with the one-ulp step of a partial of
    exactly -1 (`layernorm_bwd._published`). Its c1 = rstd · Σ (x − mean) · w · dy / N
    rounds as often as Σ x̂ · (w · dy) / N (rstd applied once after the sum rather than to
    each term). Its dw and db partials are its lanes', ⌊GRID_MULT · SMs / Q⌋ of them, which
    `dw_summation_depth` takes as the fewest programs among which the row blocks are dealt."""
    x, dy, weight = inputs["x"].detach(), inputs["dy"].detach(), inputs["weight"]
    m, n = x.shape
    mean, rstd = inputs["mean"][rows].double(), inputs["rstd"][rows].double()
    r = rstd[:, None]
    a = ((x[rows].double() - mean[:, None]) * r).abs() + (r * mean[:, None]).abs()
    dy64 = dy[rows].double()
    wdy = (dy64 if weight is None else dy64 * weight.detach().double()).abs()
    spread = 2 * a * (a * wdy).mean(-1, keepdim=True)
    dx_bound = gamma(row_sum_depth(n) + 8) * r * (wdy + spread + 2 * wdy.mean(-1, keepdim=True))
    depth = dw_summation_depth(m, n, sms)
    return (dx_bound, gamma(depth + 2) * (dy64.abs() * a).sum(0),
            gamma(depth) * dy64.abs().sum(0))


def check_outputs(names: tuple[str, ...], outputs: Outputs, dtypes: tuple[torch.dtype, ...]
                  ) -> str | None:
    """Why the outputs are not as many, or not of the dtypes, as expected (None if they are)."""
    if len(outputs) != len(names):
        return f"{len(outputs)} outputs, expected {len(names)} ({', '.join(names)})"
    for name, out, dtype in zip(names, outputs, dtypes, strict=True):
        if out.dtype != dtype:
            return f"{name}: dtype {out.dtype}, expected {dtype}"
    return None


class LayerNormFwd(WholeRows):
    """The forward: the family's row tiling and a persistent grid of whole rows, no row split
    (`WholeRows`)."""

    name = "layernorm_fwd"
    kernel_module = device_code
    row_inputs: ClassVar[tuple[str, ...]] = ("x",)

    def make_inputs(self, problem: Problem, seed: int, device: str | torch.device) -> Inputs:
        """x off-centre (mean 1, std 2), so that the mean is more than rounding; w around 1,
        b around 0."""
        g = generator(seed, device)
        dtype = problem.torch_dtype
        return {"x": normal(g, problem.m, problem.n, dtype=dtype, mean=1.0, std=2.0),
                "weight": normal(g, problem.n, dtype=dtype, mean=1.0, std=0.25),
                "bias": normal(g, problem.n, dtype=dtype, std=0.5), "eps": EPS}

    def run(self, inputs: Inputs, config: RowTilingConfig) -> Outputs:
        return layernorm_fwd(inputs["x"], inputs["weight"], inputs["bias"], inputs["eps"], config)

    def reference(self, inputs: Inputs) -> Outputs:
        return layernorm_fwd_ref(inputs["x"], inputs["weight"], inputs["bias"], inputs["eps"])

    def check(self, inputs: Inputs, outputs: Outputs, expected: Outputs | None = None
              ) -> str | None:
        """y, mean and rstd within their dtype's rounding plus the kernel's fp32 error bounds
        (`forward_error_bounds`), against the reference (or `expected`) taken `row_blocks` at a
        time: no float64 copy of a large problem exists whole."""
        x, weight, bias, eps = inputs["x"], inputs["weight"], inputs["bias"], inputs["eps"]
        why = check_outputs(("y", "mean", "rstd"), outputs,
                            (x.dtype, torch.float32, torch.float32))
        if why:
            return why
        m, n = x.shape

        def reference(rows: slice) -> Outputs:
            if expected is not None:
                return tuple(e[rows] for e in expected)
            return layernorm_fwd_ref(x[rows], weight, bias, eps)

        blocks = row_blocks(m, n)
        peaks = reference_peaks(map(reference, blocks)) if len(blocks) > 1 else [None] * 3
        for rows in blocks:
            ref = reference(rows)
            bounds = forward_error_bounds(x[rows], weight, bias, eps, ref[1].double(),
                                          ref[2].double())
            for name, out, r, bound, peak in zip(("y", "mean", "rstd"), outputs, ref, bounds,
                                                 peaks, strict=True):
                why = within_one_rounding(out[rows], r.double(), slack=SLACK[out.dtype],
                                          extra=bound, peak=peak)
                if why:
                    return f"{name}, {rows_named(rows, m)}: {why}"
        return None

    def bytes_moved(self, problem: Problem) -> int:
        m, n, s = problem.m, problem.n, problem.itemsize
        return 2 * m * n * s + 2 * n * s + 8 * m


class LayerNormBwd(KernelSpec):
    """The backward: a persistent grid whose programs keep dw and db partials, in registers
    beside a whole row or in global memory (also for looped rows), or the rows split over
    cooperating programs (`layernorm_bwd`); never prefetched."""

    name = "layernorm_bwd"
    kernel_module = backward_code
    config_type = BackwardConfig
    row_inputs: ClassVar[tuple[str, ...]] = ("x", "dy", "mean", "rstd")
    summed_outputs: ClassVar[tuple[int, ...]] = (1, 2)  # dw, db

    def space(self, problem: Problem) -> dict[str, list]:
        return {
            "BLOCK_N": pow2_range(16, max(16, min(next_pow2(problem.n), 65536))),
            "SINGLE": [True, False],
            "PREFETCH": [False],
            "DW": list(DW_MODES),
            "ROWS": [r for r in ROWS_CHOICES if r <= next_pow2(problem.m)],
            "GRID_MULT": list(BACKWARD_GRID_MULTS),
            "EVICT": [True, False],
            "num_warps": list(NUM_WARPS),
            "num_stages": list(NUM_STAGES),
        }

    def valid(self, problem: Problem, config: BackwardConfig) -> bool:
        """SINGLE needs the block to cover N exactly once; looping needs more than one chunk of
        at least `MIN_LOOP_BLOCK` (at most `max_chunks`), one row per program and the partials
        in global memory; a split row, as the RMSNorm backward's, takes 2 to `MAX_SPLIT`
        programs of at least `MIN_LOOP_BLOCK` columns, GRID_MULT of them per SM in at most
        `MAX_RESIDENT_WARPS` warps, no pipelining stages and a block of at most
        `split_elements`; several rows per program only for short rows (or a split's block);
        what a program keeps live fits its threads' registers, its stages shared memory, and
        every warp has work."""
        block, rows, warps = config.BLOCK_N, config.ROWS, config.num_warps
        if config.PREFETCH or config.DW not in DW_MODES:
            return False
        if config.DW == "split":
            if (config.SINGLE or not MIN_LOOP_BLOCK <= block < problem.n
                    or triton.cdiv(problem.n, block) > MAX_SPLIT
                    or config.GRID_MULT * warps > MAX_RESIDENT_WARPS
                    or config.num_stages != 1 or rows * block > split_elements(config)):
                return False
            # Three blocks of x and dy as stored (pipelined; a value takes itemsize / 4 of a
            # register), w, and the dw and db partials.
            live = (3 * 2 * rows * problem.itemsize / 4 + 3) * block
        elif config.SINGLE:
            if block != max(16, next_pow2(problem.n)) or config.num_stages > 2:
                return False
            # x and dy in fp32, w, and the two partials where they stay in registers.
            live = (2 * rows + 1 + 2 * (config.DW == "registers")) * block
        else:
            if (not MIN_LOOP_BLOCK <= block < problem.n or rows != 1 or config.DW != "global"
                    or triton.cdiv(problem.n, block) > max_chunks(problem.n)):
                return False
            # x and dy in fp32, w, and pass 1's two sums.
            live = 5 * block
        if rows > 1 and rows * problem.n > 16384 and config.DW != "split":
            return False
        if live > MAX_ELEMS_PER_THREAD * 32 * warps:
            return False
        if (config.num_stages - 1) * 2 * rows * block * problem.itemsize > MAX_STAGED_BYTES:
            return False
        return warps == 1 or block * rows >= 32 * warps * MIN_ELEMS_PER_THREAD

    def default(self, problem: Problem) -> BackwardConfig:
        """As the RMSNorm backward's for whole rows: short rows packed to 2K elements a program,
        512 elements a warp, 16 warps an SM in all, the partials in registers where they fit
        (else in global memory). Rows of more than 8K elements take the split, 2K chunks of
        one row at 8 warps, two programs an SM, where it is valid (rows of up to 64 chunks).
        On an H100 (bf16, N = 16384,
        M = 4096 and 16384) searches of 12 and 40 trials both picked it: 211 and 816 µs, against
        301 and 1162 µs at the RMSNorm backward's 4K chunks (which spill beside the dw and db
        partials at two programs an SM) and 296 and 1089 µs at the best whole row. Elsewhere
        the whole row up to 16K elements, and beyond it 4K chunks looped, the partials in
        global memory."""
        npow = max(16, next_pow2(problem.n))
        split = BackwardConfig(BLOCK_N=2048, SINGLE=False, PREFETCH=False, DW="split", ROWS=1,
                               GRID_MULT=2, EVICT=False, num_warps=8, num_stages=1)
        if npow >= 16384 and self.valid(problem, split):
            return split
        if npow > 16384:
            return split.replace(BLOCK_N=4096, DW="global", EVICT=True)
        rows = 1
        while rows < 16 and rows * 2 * npow <= 2048 and rows * 2 <= next_pow2(problem.m):
            rows *= 2
        warps = max(1, min(16, npow * rows // 512))
        config = BackwardConfig(BLOCK_N=npow, SINGLE=True, DW="registers", ROWS=rows,
                                GRID_MULT=max(1, min(max(BACKWARD_GRID_MULTS), 16 // warps)),
                                EVICT=False, num_warps=warps, num_stages=1)
        return config if self.valid(problem, config) else config.replace(DW="global")

    def candidates(self, problem: Problem) -> list[BackwardConfig]:
        """The RMSNorm backward's `SPLIT_CANDIDATES` that are valid for this problem, for rows
        of more than `WHOLE_ROWS` elements."""
        return split_candidates(self, problem)

    def make_inputs(self, problem: Problem, seed: int, device: str | torch.device) -> Inputs:
        """The forward's inputs with dy, and the mean and rstd the forward saves (fp32)."""
        g = generator(seed, device)
        dtype = problem.torch_dtype
        x = normal(g, problem.m, problem.n, dtype=dtype, mean=1.0, std=2.0)
        mean = x.float().mean(-1)
        return {"x": x, "dy": normal(g, problem.m, problem.n, dtype=dtype),
                "weight": normal(g, problem.n, dtype=dtype, mean=1.0, std=0.25),
                "bias": normal(g, problem.n, dtype=dtype, std=0.5), "mean": mean,
                "rstd": torch.rsqrt((x.float() - mean[:, None]).pow(2).mean(-1) + EPS)}

    def run(self, inputs: Inputs, config: BackwardConfig) -> Outputs:
        return layernorm_bwd(inputs["dy"], inputs["x"], inputs["weight"], inputs["bias"],
                             inputs["mean"], inputs["rstd"], config)

    def reference(self, inputs: Inputs) -> Outputs:
        """`layernorm_bwd_ref` taken `row_blocks` at a time (float64 temporaries of a large
        problem do not fit whole): (dx, dw, db), float64."""
        x = inputs["x"]
        m, n = x.shape
        dx = torch.empty((m, n), dtype=torch.float64, device=x.device)
        dw = torch.zeros((n,), dtype=torch.float64, device=x.device)
        db = torch.zeros_like(dw)
        for rows in row_blocks(m, n):
            dx[rows], dw_rows, db_rows = layernorm_bwd_ref(
                inputs["dy"][rows], x[rows], inputs["weight"], inputs["mean"][rows],
                inputs["rstd"][rows])
            dw += dw_rows
            db += db_rows
        return dx, dw, db

    def check(self, inputs: Inputs, outputs: Outputs, expected: Outputs | None = None
              ) -> str | None:
        """dx, dw and db within their dtype's rounding plus the kernel's fp32 error bounds
        (`backward_error_bounds`), against the reference (or `expected`) taken `row_blocks` at
        a time."""
        x, weight, bias = inputs["x"], inputs["weight"], inputs["bias"]
        why = check_outputs(("dx", "dw", "db"), outputs, (x.dtype, weight.dtype, bias.dtype))
        if why:
            return why
        dy, mean, rstd = inputs["dy"], inputs["mean"], inputs["rstd"]
        m, n = x.shape

        def reference(rows: slice) -> Outputs:
            if expected is not None:
                return expected[0][rows], expected[1], expected[2]
            return layernorm_bwd_ref(dy[rows], x[rows], weight, mean[rows], rstd[rows])

        blocks = row_blocks(m, n)
        peak = (reference_peaks(reference(rows)[:1] for rows in blocks)[0]
                if len(blocks) > 1 else None)
        sums = torch.zeros((4, n), dtype=torch.float64, device=x.device)  # dw, db, their bounds
        sms = sm_count(x.device)
        for rows in blocks:
            dx_ref, dw_rows, db_rows = reference(rows)
            dx_bound, dw_bound, db_bound = backward_error_bounds(inputs, sms, rows)
            why = within_one_rounding(outputs[0][rows], dx_ref.double(), slack=SLACK[x.dtype],
                                      extra=dx_bound, peak=peak)
            if why:
                return f"dx, {rows_named(rows, m)}: {why}"
            if expected is None:
                sums[0] += dw_rows
                sums[1] += db_rows
            sums[2] += dw_bound
            sums[3] += db_bound
        if expected is not None:
            sums[0], sums[1] = expected[1].double(), expected[2].double()
        for name, out, r, bound in (("dw", outputs[1], sums[0], sums[2]),
                                    ("db", outputs[2], sums[1], sums[3])):
            why = within_one_rounding(out, r, slack=SLACK[out.dtype], extra=bound)
            if why:
                return f"{name}: {why}"
        return None

    def bytes_moved(self, problem: Problem) -> int:
        m, n, s = problem.m, problem.n, problem.itemsize
        return 3 * m * n * s + 3 * n * s + 8 * m


FWD = LayerNormFwd()
BWD = LayerNormBwd()
#: What the entry point ``kerneltune.kernels: layernorm`` registers.
SPECS = [FWD, BWD]
