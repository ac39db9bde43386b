"""RMSNorm + int8/fp8 quantisation as a tuning target: inputs, reference, the check of q and
scale against the band fp32 leaves open, space (the family's row tiling, a whole row in two
blocks, and a cooperative row split), default.

Not hashed (see `kerneltune.kernels`): the device code is in `kerneltune.kernels.rmsnorm_quant`.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import torch

from kerneltune.kernels import rmsnorm_quant as device_code
from kerneltune.kernels._config import QuantConfig
from kerneltune.kernels._spec import (
    Inputs,
    Outputs,
    Problem,
    generator,
    next_pow2,
    normal,
    row_blocks,
    rows_named,
    within_one_rounding,
)
from kerneltune.kernels.rmsnorm_fwd_spec import Persistent, RowTiled, Split
from kerneltune.kernels.rmsnorm_quant import (
    FP8_MAX,
    MODES,
    QUANT_MODES,
    quant_dtype,
    rmsnorm_quant_fwd,
    row_parts,
)

_RNE_MAGIC = 12582912.0  # 1.5 · 2^23: adding and subtracting it rounds |v| < 2^22 half to even


def _rne_torch(v: torch.Tensor) -> torch.Tensor:
    return (v + _RNE_MAGIC) - _RNE_MAGIC


class _Quantised(NamedTuple):
    q: torch.Tensor  # what the kernel stores: int8, e4m3, or fake's out in x's dtype
    scale: torch.Tensor  # (M,) fp32
    y: torch.Tensor  # (M, N) fp32: y (int8, fp8) or z (fake)
    mul: torch.Tensor  # (M, 1) fp32: the factor y is multiplied by before rounding


def _quantise_ref(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                  eps: float, quant: str, r: torch.Tensor) -> _Quantised:
    """The kernel's fp32 arithmetic step by step, given r (M,) in fp32."""
    xhat = x.float() * r[:, None]
    if quant == "fake":
        if weight is not None:
            xhat = xhat * weight.float()
        if bias is not None:
            xhat = xhat + bias.float()
        scale = 127.0 / xhat.abs().amax(-1).clamp_min(eps)
        q = _rne_torch(xhat * scale[:, None]).clamp(-128.0, 127.0)
        out = (q * (1.0 / scale)[:, None]).to(x.dtype)
        return _Quantised(out, scale, xhat, scale[:, None])
    y = (weight.float() * xhat.to(x.dtype).float()).to(x.dtype).float()
    _, qmax, floor = MODES[quant]
    s = (y.abs().amax(-1) / qmax).clamp_min(floor)  # floor rounded to fp32, as in the kernel
    mul = (1.0 / s)[:, None]
    v = y * mul
    if quant == "int8":
        q = _rne_torch(v.clamp(-128.0, 127.0)).to(torch.int8)
    else:
        q = v.clamp(-qmax, qmax).to(quant_dtype(quant, x.dtype))
    return _Quantised(q, s, y, mul)


def _exact_rstd(x: torch.Tensor, eps: float) -> torch.Tensor:
    """r in float64 (M,)."""
    x64 = x.double()
    return torch.rsqrt(x64.pow(2).mean(-1) + eps)


def rmsnorm_quant_fwd_ref(x: torch.Tensor, weight: torch.Tensor | None,
                          bias: torch.Tensor | None, eps: float, quant: str
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch: r in float64 rounded to fp32, then the kernel's fp32 steps exactly."""
    quant_dtype(quant, x.dtype)  # the same errors as the launcher
    ref = _quantise_ref(x, weight, bias, eps, quant, _exact_rstd(x, eps).float())
    return ref.q, ref.scale


#: Relative error allowed in the kernel's r (fp32 sum of squares over up to 2^18 elements,
#: sequential across chunks, and the hardware rsqrt): the checker's band around the exact r.
RSTD_TOLERANCE = 2.0**-19


def _fp8_step(v: torch.Tensor) -> torch.Tensor:
    """The spacing of e4m3 values at magnitude |v| (float64): 2^(e - 3), 2^-9 among subnormals."""
    e = torch.floor(torch.log2(v.abs().clamp_min(2.0**-6)))
    return torch.exp2(e - 3)


def check_quantised(inputs: Inputs, outputs: Outputs) -> str | None:
    """Whether (q, scale) is what the kernel must return, up to what fp32 leaves open.

    The kernel's r differs from the exact one by a few fp32 ulps. Over r in the band
    [r·(1 - RSTD_TOLERANCE), r·(1 + RSTD_TOLERANCE)] the reference gives, per element, the
    values v that may be rounded (for half dtypes y = (w · x̂).to(dtype) may round either way
    at the band's ends; for fp32 the band is ~1e-6 relative). Then:

    - scale within the band's scales, widened by 2^-21 relative;
    - int8 (and the integer q = rne(out · scale) behind fake's out): q equal to the rounding
      of some v in the band widened by 1e-6 relative (so it may differ by one only within
      1e-6 of a rounding tie or where the band straddles one);
    - fake: out also within one rounding of its dtype of q / scale;
    - fp8: q within one e4m3 step of the band's rounded values (the interpreter's cast rounds
      some values toward zero).
    """
    x, weight, bias = inputs["x"], inputs["weight"], inputs.get("bias")
    eps, quant = inputs["eps"], inputs["quant"]
    if len(outputs) != 2:
        return f"{len(outputs)} outputs, expected 2 (q, scale)"
    q, s = (t.detach() for t in outputs)  # checked where they are: the host takes seconds
    x = x.to(q.device)
    weight = None if weight is None else weight.to(q.device)
    bias = None if bias is None else bias.to(q.device)
    m, n = x.shape
    qtype = quant_dtype(quant, x.dtype)
    if q.dtype != qtype or q.shape != (m, n):
        return f"q is {q.dtype} {tuple(q.shape)}, expected {qtype} {(m, n)}"
    if s.dtype != torch.float32 or s.shape != (m,):
        return f"scale is {s.dtype} {tuple(s.shape)}, expected torch.float32 {(m,)}"
    for part in row_blocks(m, n):  # a float copy of the whole q took 16 GiB at 16384 x 262144
        if not torch.isfinite(s[part]).all() or not torch.isfinite(q[part].float()).all():
            return f"non-finite values in q or scale, {rows_named(part, m)}"
        why = _check_rows(x[part], weight, bias, eps, quant, q[part], s[part], part.start)
        if why:
            return why
    return None


def _check_rows(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                eps: float, quant: str, q: torch.Tensor, s: torch.Tensor, row0: int
                ) -> str | None:
    """`check_quantised` of rows row0, row0 + 1, ... (each row's band is its own)."""
    r = _exact_rstd(x, eps)
    ends = [_quantise_ref(x, weight, bias, eps, quant, (r * (1 + k * RSTD_TOLERANCE)).float())
            for k in (-1, 1)]
    scales = torch.stack([e.scale.double() for e in ends])
    s_lo = scales.min(0).values * (1 - 2.0**-21)
    s_hi = scales.max(0).values * (1 + 2.0**-21)
    bad = (s.double() < s_lo) | (s.double() > s_hi)
    if bad.any():
        i = int(bad.nonzero()[0])
        return (f"scale of row {row0 + i}: {s[i].item():.9g} outside "
                f"[{s_lo[i].item():.9g}, {s_hi[i].item():.9g}]")
    # The value rounded is y · mul; any end's y with any end's mul is a value some r in the
    # band gives (y and mul step at different points of the band).
    vs = torch.stack([a.y.double() * b.mul.double() for a in ends for b in ends])
    v_lo, v_hi = vs.min(0).values, vs.max(0).values
    v_lo, v_hi = v_lo - 1e-6 * v_lo.abs(), v_hi + 1e-6 * v_hi.abs()
    if quant == "fp8":
        qtype = q.dtype
        fp8_lo = v_lo.clamp(-FP8_MAX, FP8_MAX).float().to(qtype).double()
        fp8_hi = v_hi.clamp(-FP8_MAX, FP8_MAX).float().to(qtype).double()
        got = q.double()
        nearest = torch.minimum(torch.maximum(got, fp8_lo), fp8_hi)
        step = _fp8_step(torch.minimum(got.abs(), nearest.abs()))
        return _first_bad(q, (got - nearest).abs() > step, nearest, "more than one e4m3 step",
                          row0)
    if quant == "fake":
        got = torch.round(q.double() * s.double()[:, None])
        why = within_one_rounding(q, got / s.double()[:, None])
        if why:
            return f"out is not q / scale (rows from {row0}): {why}"
    else:
        got = q.double()
    q_lo = torch.round(v_lo.clamp(-128.0, 127.0))
    q_hi = torch.round(v_hi.clamp(-128.0, 127.0))
    return _first_bad(q, (got < q_lo) | (got > q_hi), q_lo, "not a rounding of y / s", row0)


def _first_bad(q: torch.Tensor, bad: torch.Tensor, expected: torch.Tensor, what: str,
               row0: int) -> str | None:
    if not bad.any():
        return None
    i, j = (int(k) for k in bad.nonzero()[0])
    return (f"{int(bad.sum())}/{bad.numel()} values {what} (rows from {row0}); first at "
            f"({row0 + i}, {j}): got {q[i, j].double().item():.6g}, expected "
            f"{expected[i, j].item():.6g}")


class RMSNormQuantFwd(RowTiled):
    name = "rmsnorm_quant_fwd"
    kernel_module = device_code
    config_type = QuantConfig
    options: ClassVar[dict[str, tuple[str, ...]]] = {"quant": QUANT_MODES}
    row_inputs: ClassVar[tuple[str, ...]] = ("x",)
    #: The modes a key's search times: its entry has no mode, so it serves both, and int8's
    #: fastest config can run fp8 far slower (two blocks on a persistent grid at 4 warps left
    #: fp8 well behind int8, where 8 warps ran both alike). Fake-quant, a simulation, takes
    #: their config.
    timed_modes: ClassVar[tuple[str, ...]] = ("int8", "fp8")
    staged_splits: ClassVar[bool] = True
    #: Fastest first. First the staged splits of one row a block (Triton's pipeliner loads rows
    #: ahead through shared memory, as for the forward's `STAGED_SPLITS`): six 4K programs of 2
    #: warps hold 24K elements an SM and, with the row before stored first in each step
    #: (`kerneltune.kernels.rmsnorm_quant._quantise_split_rows`), do not spill; twelve 2K programs
    #: of one warp hold the same 24K with no barrier in their reductions, and win where the six wait
    #: on the max of each row, though not at 64 chunks; three 8K programs of 4 warps come close.
    #: Then staged splits of 16K an SM: four 4K programs of 4 warps, eight 2K of two warps (where
    #: they take at most `MAX_COOP` chunks), two 8K, one 16K. Then the register-prefetch splits,
    #: which wait once for both agreements. A lane's step costs a fixed latency plus a little per
    #: element its SM holds, so more elements an SM take fewer steps; 32K (eight 4K programs of 2
    #: warps) spills again and runs slower.
    split_candidates: ClassVar[tuple[Split, ...]] = (
        (4096, 1, 2, 6, 3), (2048, 1, 1, 12, 3), (8192, 1, 4, 3, 3), (4096, 1, 4, 4, 3),
        (2048, 1, 2, 8, 3), (8192, 1, 8, 2, 3), (16384, 1, 8, 1, 3), (4096, 1, 4, 3, 1),
        (16384, 1, 8, 1, 1), (8192, 1, 8, 2, 1), (4096, 1, 4, 4, 1))
    long_row_split: ClassVar[Split] = (4096, 1, 2, 6, 3)
    #: From 32768 on at any M: there a split measured well ahead of the looped kernel.
    long_rows: ClassVar[int] = 32768
    persistent: ClassVar[bool] = True
    #: Fastest first: at a few thousand rows of 2K-8K elements they beat one program per row
    #: block. Then, for few rows, the forward's first (`FORWARD_PERSISTENT`): with one row block
    #: a program the persistent path still loads the weight with the rows, though quant gains
    #: less from that than the forward.
    persistent_candidates: ClassVar[tuple[Persistent, ...]] = (
        (3, 0.5, 1), (4, 0.5, 1), (3, 1, 1), (4, 1, 1), (2, 1, 1), (2, 0.5, 1), (2, 1, 0.5))

    def served(self, problem: Problem) -> list[Problem]:
        """A problem of no mode (a tuning key's) as each of `timed_modes`."""
        if problem.option("quant", None) is not None:
            return [problem]
        return [self.problem(problem.m, problem.n, problem.dtype, quant=mode)
                for mode in self.timed_modes]

    def space(self, problem: Problem) -> dict[str, list]:
        return {**super().space(problem), "PARTS": [1, 2], "X_LAYOUT": [False, True]}

    def valid(self, problem: Problem, config: QuantConfig) -> bool:
        """The family's constraints (a whole row, one block or two, may run on a persistent grid);
        PARTS = 2 only for a whole row (SINGLE) that two blocks (`row_parts`; BLOCK_N is the
        first) cover in fewer lanes than one, the second with an element for every thread,
        within the register bounds of the one block, on a persistent grid as it may; q in x's
        layout (X_LAYOUT) only where one program holds or loops over whole rows: the split
        stores it as it always has."""
        if config.X_LAYOUT and config.COOP:
            return False
        if config.PARTS == 1:
            return super().valid(problem, config)
        head, tail = row_parts(problem.n)
        npow = next_pow2(problem.n)
        return (config.SINGLE and tail > 0 and head + tail < npow
                and config.BLOCK_N == head
                and tail * config.ROWS >= 32 * config.num_warps
                and super().valid(problem, config.replace(BLOCK_N=npow)))

    def candidates(self, problem: Problem) -> list[QuantConfig]:
        """The family's (splits, the default's whole row on a persistent grid); for a whole
        row, the default's in two blocks, at its warps and half as many (at N = 5120, 4096 +
        1024 at half the warps measured fastest), then on the persistent grids the one block
        tries (four programs of 8 warps an SM ran both modes near copy speed); for a row too
        long for the default's whole row, the family's (its `one_row_launch` first)."""
        found, default = super().candidates(problem), self.default(problem)
        if not default.SINGLE:
            return found
        warps, rows = default.num_warps, default.ROWS
        two = default.replace(PARTS=2, BLOCK_N=row_parts(problem.n)[0])
        return [*found, *self.valid_variants(
            problem, two, ("num_warps",),
            [(w,) for w in sorted({warps, max(1, warps // 2)}, reverse=True)]),
            *self.valid_variants(
                problem, two.replace(EVICT=True), ("GRID_MULT", "num_warps", "ROWS"),
                [(g, max(1, int(warps * fw)), max(1, int(rows * fr)))
                 for g, fw, fr in self.persistent_candidates])]

    def one_row_launch(self, problem: Problem) -> list[QuantConfig]:
        """The family's; for a row longer than the default's whole row (two register blocks'
        worth, 16 warps) with q stored in x's layout. At rows of 32K that whole row beat the
        best split and looped configs, which had stalled near the forward's time where a
        bf16 -> fp8 copy of the same bytes runs near copy speed; q in x's layout gained more
        still, in int8 and fp8."""
        launches = super().one_row_launch(problem)
        if self.default(problem)["SINGLE"]:
            return launches
        return [c for c in (c.replace(X_LAYOUT=True) for c in launches) if self.valid(problem, c)]

    def make_inputs(self, problem: Problem, seed: int, device: str | torch.device) -> Inputs:
        quant = str(problem.option("quant", QUANT_MODES[0]))
        g = generator(seed, device)
        dtype = problem.torch_dtype
        x = normal(g, problem.m, problem.n, dtype=dtype)
        w = normal(g, problem.n, dtype=dtype, mean=1.0, std=0.25)
        bias = None
        if quant == "fake":
            bias = normal(g, problem.n, dtype=dtype, std=0.1)
        return {"x": x, "weight": w, "bias": bias, "eps": 1e-5 if quant == "fake" else 1e-6,
                "quant": quant}

    def run(self, inputs: Inputs, config: QuantConfig) -> Outputs:
        return rmsnorm_quant_fwd(inputs["x"], inputs["weight"], inputs.get("bias"),
                                 inputs["eps"], inputs["quant"], config)

    def reference(self, inputs: Inputs) -> Outputs:
        return rmsnorm_quant_fwd_ref(inputs["x"], inputs["weight"], inputs.get("bias"),
                                     inputs["eps"], inputs["quant"])

    def check(self, inputs: Inputs, outputs: Outputs, expected: Outputs | None = None
              ) -> str | None:
        """See `check_quantised`: the bounds come from the inputs, so `expected` is unused."""
        return check_quantised(inputs, outputs)

    def bytes_moved(self, problem: Problem) -> int:
        m, n, s = problem.m, problem.n, problem.itemsize
        quant = problem.option("quant", QUANT_MODES[0])
        q_bytes = s if quant == "fake" else 1
        params = 2 * n * s if quant == "fake" else n * s  # weight (+ bias for fake)
        return m * n * s + m * n * q_bytes + 4 * m + params


SPEC = RMSNormQuantFwd()
