"""RMSNorm + per-token-group quantisation, and its residual-fused form, as tuning targets:
inputs, float64 reference, the check of q and the scales against the band fp32 leaves open,
space (the family's row tiling and persistent grid; no row split) and default.

Registered through the entry-point group ``kerneltune.kernels`` (`SPECS`). Not hashed: the
device code is in `kerneltune.kernels.rmsnorm_group_quant`.

Options: `quant` ("fp8", "int8"), `group_size` (32 to 256; 0 is one group a row, per-token),
`scale_ue8m0`, `column_major_scales`. A tuning key has none: its search times fp8 and int8 at
the group size `group_of` picks for its N (`served`).
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import torch

from kerneltune.kernels import rmsnorm_group_quant as device_code
from kerneltune.kernels._config import RowTilingConfig
from kerneltune.kernels._spec import (
    Inputs,
    Outputs,
    Problem,
    generator,
    normal,
    row_blocks,
    rows_named,
)
from kerneltune.kernels.rmsnorm_fwd_spec import WholeRows
from kerneltune.kernels.rmsnorm_group_quant import (
    GROUP_QUANT_MODES,
    GROUP_SIZES,
    check_group_size,
    rmsnorm_group_quant_fwd,
)
from kerneltune.kernels.rmsnorm_quant import FP8_MAX, MODES, quant_dtype
from kerneltune.kernels.rmsnorm_quant_spec import (
    RSTD_TOLERANCE,
    _exact_rstd,
    _first_bad,
    _fp8_step,
    _rne_torch,
)

#: The group size of a problem that names none, where it divides N (DeepSeek's and vLLM's).
DEFAULT_GROUP = 128


def group_of(problem: Problem) -> int | None:
    """The problem's group size: its option (0: None, one group a row), else `DEFAULT_GROUP`,
    else the largest of `GROUP_SIZES` dividing N, else None."""
    group = problem.option("group_size", None)
    if group is not None:
        return int(group) or None
    fits = [g for g in (DEFAULT_GROUP, *sorted(GROUP_SIZES, reverse=True)) if problem.n % g == 0]
    return fits[0] if fits else None


def pow2_ceil(s: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2 s) of positive fp32 s, in fp32 (UE8M0 scales)."""
    return torch.exp2(torch.ceil(torch.log2(s.double()))).float()


class _Grouped(NamedTuple):
    q: torch.Tensor  # (M, N) int8 or e4m3
    scale: torch.Tensor  # (M, G) fp32, as stored
    raw: torch.Tensor  # (M, G) fp32: the scale before UE8M0 rounding
    y: torch.Tensor  # (M, N) fp32
    mul: torch.Tensor  # (M, N) fp32: each element's factor before rounding


def _group_quantise_ref(x: torch.Tensor, weight: torch.Tensor, quant: str, group: int | None,
                        ue8m0: bool, r: torch.Tensor) -> _Grouped:
    """The kernel's fp32 arithmetic step by step on x (the sum, with a residual), given r (M,)
    in fp32."""
    m, n = x.shape
    size = n if group is None else group
    y = (weight.float() * (x.float() * r[:, None]).to(x.dtype).float()).to(x.dtype).float()
    _, qmax, floor = MODES[quant]
    groups = y.reshape(m, n // size, size)
    raw = (groups.abs().amax(-1) / qmax).clamp_min(floor)  # fp32 division, as in the kernel
    scale = pow2_ceil(raw) if ue8m0 else raw
    mul = (1.0 / scale)[..., None].expand(m, n // size, size)
    v = groups * mul
    if quant == "int8":
        q = _rne_torch(v.clamp(-128.0, 127.0)).to(torch.int8)
    else:
        q = v.clamp(-qmax, qmax).to(quant_dtype(quant, x.dtype))
    return _Grouped(q.reshape(m, n), scale, raw, y, mul.reshape(m, n))


def added_ref(x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    """x + residual in fp32 rounded to x's dtype (the new residual); x where there is none."""
    return x if residual is None else (x.float() + residual.float()).to(x.dtype)


def rmsnorm_group_quant_fwd_ref(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
    quant: str, group_size: int | None, scale_ue8m0: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Plain torch: r in float64 rounded to fp32, then the kernel's fp32 steps exactly.
    (q, scales (M, N / group)[, new residual]); the scales row-major."""
    check_group_size(group_size, x.shape[-1])
    s = added_ref(x, residual)
    ref = _group_quantise_ref(s, weight, quant, group_size, scale_ue8m0,
                              _exact_rstd(s, eps).float())
    return (ref.q, ref.scale) if residual is None else (ref.q, ref.scale, s)


def check_group_quantised(inputs: Inputs, outputs: Outputs) -> str | None:
    """Whether (q, scales[, new residual]) is what the kernel must return, up to what fp32
    leaves open: the new residual exactly the rounded sum; the rest as
    `kerneltune.kernels.rmsnorm_quant_spec.check_quantised` bounds the per-token mode, per
    group: over r in the band [r·(1 - RSTD_TOLERANCE), r·(1 + RSTD_TOLERANCE)] around the exact
    r, each scale within the band's scales widened by 2^-21 relative (then rounded up to a
    power of two with UE8M0), int8 q a rounding of some value of the band (widened by 1e-6),
    fp8 q within one e4m3 step of the band's."""
    x, residual, weight = inputs["x"], inputs.get("residual"), inputs["weight"]
    quant, group, ue8m0 = inputs["quant"], inputs["group_size"], inputs["scale_ue8m0"]
    expected = 2 if residual is None else 3
    if len(outputs) != expected:
        return f"{len(outputs)} outputs, expected {expected}"
    q, s = (t.detach() for t in outputs[:2])
    x, weight = x.to(q.device), weight.to(q.device)
    m, n = x.shape
    groups = 1 if group is None else n // group
    qtype = quant_dtype(quant, x.dtype)
    if q.dtype != qtype or q.shape != (m, n):
        return f"q is {q.dtype} {tuple(q.shape)}, expected {qtype} {(m, n)}"
    if s.dtype != torch.float32 or s.shape != (m, groups):
        return f"scales are {s.dtype} {tuple(s.shape)}, expected torch.float32 {(m, groups)}"
    if inputs.get("column_major_scales") and m > 1 and s.stride() != (1, m):
        return f"scales have strides {s.stride()}, expected column-major (1, {m})"
    summed = added_ref(x, None if residual is None else residual.to(q.device))
    if residual is not None and not torch.equal(outputs[2].detach(), summed):
        return "the new residual is not x + residual rounded to x's dtype"
    for part in row_blocks(m, n):
        if not torch.isfinite(s[part]).all() or not torch.isfinite(q[part].float()).all():
            return f"non-finite values in q or scales, {rows_named(part, m)}"
        why = _check_rows(summed[part], weight, inputs["eps"], quant, group, ue8m0, q[part],
                          s[part], part.start)
        if why:
            return why
    return None


def _check_rows(x: torch.Tensor, weight: torch.Tensor, eps: float, quant: str,
                group: int | None, ue8m0: bool, q: torch.Tensor, s: torch.Tensor, row0: int
                ) -> str | None:
    """`check_group_quantised` of rows row0, row0 + 1, ... (each row's band is its own)."""
    r = _exact_rstd(x, eps)
    ends = [_group_quantise_ref(x, weight, quant, group, ue8m0,
                                (r * (1 + k * RSTD_TOLERANCE)).float()) for k in (-1, 1)]
    raws = torch.stack([e.raw.double() for e in ends])
    s_lo = raws.min(0).values * (1 - 2.0**-21)
    s_hi = raws.max(0).values * (1 + 2.0**-21)
    if ue8m0:
        s_lo, s_hi = pow2_ceil(s_lo.float()).double(), pow2_ceil(s_hi.float()).double()
    bad = (s.double() < s_lo) | (s.double() > s_hi)
    if bad.any():
        i, g = (int(k) for k in bad.nonzero()[0])
        return (f"scale of row {row0 + i}, group {g}: {s[i, g].item():.9g} outside "
                f"[{s_lo[i, g].item():.9g}, {s_hi[i, g].item():.9g}]")
    if ue8m0 and not torch.equal(s, pow2_ceil(s)):
        return "UE8M0 scales that are not powers of two"
    # The value rounded is y · mul; any end's y with any end's mul is one some r gives.
    vs = torch.stack([a.y.double() * b.mul.double() for a in ends for b in ends])
    v_lo, v_hi = vs.min(0).values, vs.max(0).values
    v_lo, v_hi = v_lo - 1e-6 * v_lo.abs(), v_hi + 1e-6 * v_hi.abs()
    if quant == "fp8":
        fp8_lo = v_lo.clamp(-FP8_MAX, FP8_MAX).float().to(q.dtype).double()
        fp8_hi = v_hi.clamp(-FP8_MAX, FP8_MAX).float().to(q.dtype).double()
        got = q.double()
        nearest = torch.minimum(torch.maximum(got, fp8_lo), fp8_hi)
        step = _fp8_step(torch.minimum(got.abs(), nearest.abs()))
        return _first_bad(q, (got - nearest).abs() > step, nearest, "more than one e4m3 step",
                          row0)
    got = q.double()
    q_lo = torch.round(v_lo.clamp(-128.0, 127.0))
    q_hi = torch.round(v_hi.clamp(-128.0, 127.0))
    return _first_bad(q, (got < q_lo) | (got > q_hi), q_lo, "not a rounding of y / s", row0)


class RMSNormGroupQuantFwd(WholeRows):
    """The family's row tiling and a persistent grid of whole rows, no row split (`WholeRows`;
    a looped chunk is at least 512 columns, so it holds whole groups)."""

    name = "rmsnorm_group_quant_fwd"
    kernel_module = device_code
    options: ClassVar[dict[str, tuple]] = {
        "quant": GROUP_QUANT_MODES, "group_size": (DEFAULT_GROUP, 32, 64, 256, 0),
        "scale_ue8m0": (False, True), "column_major_scales": (False, True)}
    row_inputs: ClassVar[tuple[str, ...]] = ("x",)
    #: The modes a key's search times (its entry has no mode, so it serves both).
    timed_modes: ClassVar[tuple[str, ...]] = GROUP_QUANT_MODES
    residual: ClassVar[bool] = False

    def served(self, problem: Problem) -> list[Problem]:
        """A problem of no mode (a tuning key's) as each of `timed_modes`, at its `group_of`."""
        if problem.option("quant", None) is not None:
            return [problem]
        return [self.problem(problem.m, problem.n, problem.dtype, quant=mode,
                             group_size=group_of(problem) or 0) for mode in self.timed_modes]

    def make_inputs(self, problem: Problem, seed: int, device: str | torch.device) -> Inputs:
        g = generator(seed, device)
        dtype = problem.torch_dtype
        inputs: Inputs = {"x": normal(g, problem.m, problem.n, dtype=dtype)}
        if self.residual:
            inputs["residual"] = normal(g, problem.m, problem.n, dtype=dtype, std=2.0)
        return {**inputs, "weight": normal(g, problem.n, dtype=dtype, mean=1.0, std=0.25),
                "eps": 1e-6, "quant": str(problem.option("quant", GROUP_QUANT_MODES[0])),
                "group_size": group_of(problem),
                "scale_ue8m0": bool(problem.option("scale_ue8m0", False)),
                "column_major_scales": bool(problem.option("column_major_scales", False))}

    def run(self, inputs: Inputs, config: RowTilingConfig) -> Outputs:
        return rmsnorm_group_quant_fwd(
            inputs["x"], inputs.get("residual"), inputs["weight"], inputs["eps"],
            inputs["quant"], inputs["group_size"], inputs["scale_ue8m0"],
            inputs["column_major_scales"], config)

    def reference(self, inputs: Inputs) -> Outputs:
        return rmsnorm_group_quant_fwd_ref(
            inputs["x"], inputs.get("residual"), inputs["weight"], inputs["eps"],
            inputs["quant"], inputs["group_size"], inputs["scale_ue8m0"])

    def check(self, inputs: Inputs, outputs: Outputs, expected: Outputs | None = None
              ) -> str | None:
        """See `check_group_quantised`: the bounds come from the inputs, so `expected` is
        unused."""
        return check_group_quantised(inputs, outputs)

    def bytes_moved(self, problem: Problem) -> int:
        """x read and q written (one byte an element), the weight, the fp32 scales; with a
        residual, the residual read and the new one written."""
        m, n, s = problem.m, problem.n, problem.itemsize
        group = group_of(problem)
        scales = 4 * m * (1 if group is None else n // group)
        rows = m * n * (3 * s if self.residual else s) + m * n
        return rows + n * s + scales


class AddRMSNormGroupQuantFwd(RMSNormGroupQuantFwd):
    """The residual-fused form (vLLM's fused add + RMSNorm + quant): the same tiling; its key
    moves twice the rows' bytes, so it is tuned apart, as add + norm is from the norm."""

    name = "add_rmsnorm_group_quant_fwd"
    row_inputs: ClassVar[tuple[str, ...]] = ("x", "residual")
    residual: ClassVar[bool] = True


FWD = RMSNormGroupQuantFwd()
ADD_FWD = AddRMSNormGroupQuantFwd()
#: What the entry point ``kerneltune.kernels: rmsnorm_group_quant`` registers.
SPECS = [FWD, ADD_FWD]
