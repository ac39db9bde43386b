"""RMSNorm forward fused with per-row dynamic quantisation (int8, fp8 e4m3, or int8 fake-quant).

Maths, per row of N elements (r as in the forward, eps given)::

    r = 1 / sqrt(mean(x², over N, in fp32) + eps)

int8 / fp8 (vLLM's per-token dynamic quantisation of the llama-mode output)::

    y = (w · (x · r).to(x.dtype)).to(x.dtype)         products in fp32, y as the forward returns it
    int8:  s = max(max|y| / 127, 2^-23)               2^-23 = torch.finfo(float32).eps
           q = int8(clamp(rne(y · (1/s)), -128, 127)) rne: round half to even
    fp8:   s = max(max|y| / 448, 1 / (448 · 512))
           q = e4m3fn(clamp(y · (1/s), -448, 448))    the cast rounds to nearest even
    returns q (M, N) and s (M,) fp32: y ≈ q · s

fake (the quantised RMSNorm of int8 simulation, output dequantised in the input dtype)::

    z     = x · r [· gain] [+ bias]                   all in fp32, gain and bias optional
    scale = 127 / max(max|z|, eps)
    out   = (clamp(rne(z · scale), -128, 127) · (1/scale)).to(x.dtype)
    returns out (M, N) in x's dtype and scale (M,) fp32: z ≈ out = q / scale

Both divisions by a per-row value are one IEEE division per row and a multiply per element
(vLLM does the same); ·(1/scale) is within one fp32 ulp of /scale before the final rounding.

One program handles ROWS rows. SINGLE keeps a whole row block in registers (BLOCK_N ≥ N), so
max|y| comes for free. Otherwise the row is looped over in BLOCK_N chunks three times: sum of
squares; y and its running max; y again, quantised and stored. x is re-read, not y spilled to
a scratch buffer: the first two passes keep x in L2 (evict_last) and the last one lets it go
(evict_first), so DRAM sees x once and q once, the minimum, where a scratch y would add a
write and a read of M·N elements.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import torch
import triton
import triton.language as tl

from kerneltune.kernels._spec import (
    Config,
    Inputs,
    KernelSpec,
    Outputs,
    Problem,
    generator,
    interpreting,
    launch_options,
    normal,
    within_one_rounding,
)
from kerneltune.kernels.rmsnorm_fwd import (
    default_row_tiling,
    row_tiling_space,
    valid_row_tiling,
)

QUANT_MODES = ("int8", "fp8", "fake")
INT8_MIN_SCALE = float(torch.finfo(torch.float32).eps)
FP8_MAX = 448.0
FP8_MIN_SCALE = 1.0 / (FP8_MAX * 512.0)
#: Per mode: the kernel's MODE, the largest quantised magnitude, the smallest scale (fake
#: clamps max|z| to eps instead).
_MODES = {"int8": (0, 127.0, INT8_MIN_SCALE), "fp8": (1, FP8_MAX, FP8_MIN_SCALE),
          "fake": (2, 127.0, 0.0)}
_RNE_MAGIC = 12582912.0  # 1.5 · 2^23: adding and subtracting it rounds |v| < 2^22 half to even


@triton.jit
def _load_row_chunk(ptrs, mask, EVICT: tl.constexpr, POLICY: tl.constexpr):
    if EVICT:
        v = tl.load(ptrs, mask=mask, other=0.0, eviction_policy=POLICY)
    else:
        v = tl.load(ptrs, mask=mask, other=0.0)
    return v.to(tl.float32)


@triton.jit
def _cast(v, DTYPE: tl.constexpr, SOFT_ROUND: tl.constexpr):
    """fp32 v converted to DTYPE, rounded to nearest, ties to even.

    SOFT_ROUND rounds in fp32 first, with integer arithmetic on the bits, so that the cast is
    exact: the interpreter's fp32 -> bf16 cast truncates and its fp32 -> e4m3 cast drops the
    carry into the exponent (31.5 becomes 16). Compiled kernels use the hardware conversion.
    """
    if SOFT_ROUND:
        if tl.bfloat16 == DTYPE:  # keep 7 of fp32's 23 mantissa bits
            bits = v.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            v = bits.to(tl.float32, bitcast=True)
        if tl.float8e4nv == DTYPE:  # keep 3 mantissa bits; below 2^-6 steps of 2^-9
            bits = v.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000
            v = tl.where(tl.abs(v) < 0.015625, (v + 24576.0) - 24576.0,
                         bits.to(tl.float32, bitcast=True))
    return v.to(DTYPE)


@triton.jit
def _rne(v):
    """Round fp32 v half to even; exact for |v| < 2^22 (no libdevice: runs in the interpreter)."""
    return (v + 12582912.0) - 12582912.0


@triton.jit
def _normed(x, r, W, B, c, N, MODE: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
            DTYPE: tl.constexpr, SOFT_ROUND: tl.constexpr):
    """The values to quantise for the fp32 chunk x at columns c: y (int8, fp8) or z (fake).

    Masked columns come out 0, so they never raise a row's max.
    """
    xhat = x * r[:, None]
    if MODE == 2:
        if HAS_W:
            xhat = xhat * tl.load(W + c, mask=c < N, other=0.0).to(tl.float32)[None, :]
        if HAS_B:
            xhat = xhat + tl.load(B + c, mask=c < N, other=0.0).to(tl.float32)[None, :]
        return xhat
    w = tl.load(W + c, mask=c < N, other=0.0).to(tl.float32)
    y = w[None, :] * _cast(xhat, DTYPE, SOFT_ROUND).to(tl.float32)
    return _cast(y, DTYPE, SOFT_ROUND).to(tl.float32)


@triton.jit
def _row_scale(amax, eps, min_scale, MODE: tl.constexpr, QMAX: tl.constexpr):
    """(the row's stored scale, the factor y is multiplied by before rounding), both (ROWS,)."""
    if MODE == 2:
        scale = tl.math.div_rn(QMAX, tl.maximum(amax, eps))
        return scale, scale
    s = tl.maximum(tl.math.div_rn(amax, QMAX), min_scale)
    return s, tl.math.div_rn(1.0, s)


@triton.jit
def _quantise(y, mul, scale, MODE: tl.constexpr, QMAX: tl.constexpr, QTYPE: tl.constexpr,
              SOFT_ROUND: tl.constexpr):
    """The stored values of the chunk y given its row's factor `mul` and scale (ROWS,)."""
    v = y * mul[:, None]
    if MODE == 0:
        return _rne(tl.minimum(tl.maximum(v, -128.0), 127.0)).to(QTYPE)
    if MODE == 1:
        return _cast(tl.minimum(tl.maximum(v, -QMAX), QMAX), QTYPE, SOFT_ROUND)
    q = tl.minimum(tl.maximum(_rne(v), -128.0), 127.0)
    inv = tl.math.div_rn(1.0, scale)
    return _cast(q * inv[:, None], QTYPE, SOFT_ROUND)


@triton.jit
def _rmsnorm_quant_kernel(
    X, W, B, Q, SCALE,
    stride_x, stride_q, M, N, eps, min_scale,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, SINGLE: tl.constexpr, EVICT: tl.constexpr,
    MODE: tl.constexpr, QMAX: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    SOFT_ROUND: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < M
    rows = rows.to(tl.int64)
    x_rows = X + rows[:, None] * stride_x
    q_rows = Q + rows[:, None] * stride_q
    dtype = X.dtype.element_ty
    qtype = Q.dtype.element_ty
    cols = tl.arange(0, BLOCK_N)
    if SINGLE:
        mask = row_ok[:, None] & (cols[None, :] < N)
        x = _load_row_chunk(x_rows + cols[None, :], mask, EVICT, "evict_first")
        r = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
        y = _normed(x, r, W, B, cols, N, MODE, HAS_W, HAS_B, dtype, SOFT_ROUND)
        scale, mul = _row_scale(tl.max(tl.abs(y), axis=1), eps, min_scale, MODE, QMAX)
        q = _quantise(y, mul, scale, MODE, QMAX, qtype, SOFT_ROUND)
        tl.store(q_rows + cols[None, :], q, mask=mask)
    else:
        acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            mask = row_ok[:, None] & (c[None, :] < N)
            x = _load_row_chunk(x_rows + c[None, :], mask, EVICT, "evict_last")
            acc += x * x
        r = tl.rsqrt(tl.sum(acc, axis=1) / N + eps)
        amax = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            mask = row_ok[:, None] & (c[None, :] < N)
            x = _load_row_chunk(x_rows + c[None, :], mask, EVICT, "evict_last")
            y = _normed(x, r, W, B, c, N, MODE, HAS_W, HAS_B, dtype, SOFT_ROUND)
            amax = tl.maximum(amax, tl.abs(y))
        scale, mul = _row_scale(tl.max(amax, axis=1), eps, min_scale, MODE, QMAX)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            mask = row_ok[:, None] & (c[None, :] < N)
            x = _load_row_chunk(x_rows + c[None, :], mask, EVICT, "evict_first")
            y = _normed(x, r, W, B, c, N, MODE, HAS_W, HAS_B, dtype, SOFT_ROUND)
            q = _quantise(y, mul, scale, MODE, QMAX, qtype, SOFT_ROUND)
            tl.store(q_rows + c[None, :], q, mask=mask)
    tl.store(SCALE + rows, scale, mask=row_ok)


def quant_dtype(quant: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype of q: int8, float8_e4m3fn, or the input dtype for fake-quant."""
    if quant == "int8":
        return torch.int8
    if quant == "fp8":
        fp8 = getattr(torch, "float8_e4m3fn", None)
        if fp8 is None:
            raise TypeError(f"quant='fp8' needs torch.float8_e4m3fn, absent in torch "
                            f"{torch.__version__}")
        return fp8
    if quant == "fake":
        return dtype
    raise ValueError(f"quant must be one of {QUANT_MODES}, got {quant!r}")


def rmsnorm_quant_fwd(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
    quant: str, config: Config,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch on a (M, N) view with unit stride along N (rows may be strided).

    `weight` is the RMSNorm weight for int8/fp8 (required) and the optional gain for fake;
    `bias` is only for fake. Returns q (M, N) (int8, float8_e4m3fn, or x's dtype for fake) and
    the per-row scale (M,) fp32: the dequantisation step s for int8/fp8, the quantisation
    factor 127 / max|z| for fake.
    """
    qtype = quant_dtype(quant, x.dtype)
    if quant != "fake":
        if weight is None:
            raise ValueError(f"quant={quant!r} needs the RMSNorm weight")
        if bias is not None:
            raise ValueError(f"bias is only supported with quant='fake', not {quant!r}")
    m, n = x.shape
    q = torch.empty((m, n), dtype=qtype, device=x.device)
    scale = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m == 0:
        return q, scale
    rows = int(config["ROWS"])
    mode, qmax, min_scale = _MODES[quant]
    # An absent gain or bias is never read: any pointer will do.
    _rmsnorm_quant_kernel[(triton.cdiv(m, rows),)](
        x, x if weight is None else weight, x if bias is None else bias, q, scale,
        x.stride(0), q.stride(0), m, n, eps, min_scale,
        BLOCK_N=config["BLOCK_N"], ROWS=rows, SINGLE=config["SINGLE"], EVICT=config["EVICT"],
        MODE=mode, QMAX=qmax, HAS_W=weight is not None, HAS_B=bias is not None,
        SOFT_ROUND=interpreting(), **launch_options(config),
    )
    return q, scale


# ------------------------------------------------------------------------------ reference


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
    _, qmax, floor = _MODES[quant]
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
      ~1% of values toward zero).
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
    if not torch.isfinite(s).all() or not torch.isfinite(q.float()).all():
        return "non-finite values in q or scale"
    r = _exact_rstd(x, eps)
    ends = [_quantise_ref(x, weight, bias, eps, quant, (r * (1 + k * RSTD_TOLERANCE)).float())
            for k in (-1, 1)]
    scales = torch.stack([e.scale.double() for e in ends])
    s_lo = scales.min(0).values * (1 - 2.0**-21)
    s_hi = scales.max(0).values * (1 + 2.0**-21)
    bad = (s.double() < s_lo) | (s.double() > s_hi)
    if bad.any():
        i = int(bad.nonzero()[0])
        return (f"scale of row {i}: {s[i].item():.9g} outside "
                f"[{s_lo[i].item():.9g}, {s_hi[i].item():.9g}]")
    # The value rounded is y · mul; any end's y with any end's mul is a value some r in the
    # band gives (y and mul step at different points of the band).
    vs = torch.stack([a.y.double() * b.mul.double() for a in ends for b in ends])
    v_lo, v_hi = vs.min(0).values, vs.max(0).values
    v_lo, v_hi = v_lo - 1e-6 * v_lo.abs(), v_hi + 1e-6 * v_hi.abs()
    if quant == "fp8":
        fp8_lo = v_lo.clamp(-FP8_MAX, FP8_MAX).float().to(qtype).double()
        fp8_hi = v_hi.clamp(-FP8_MAX, FP8_MAX).float().to(qtype).double()
        got = q.double()
        nearest = torch.minimum(torch.maximum(got, fp8_lo), fp8_hi)
        step = _fp8_step(torch.minimum(got.abs(), nearest.abs()))
        return _first_bad(q, (got - nearest).abs() > step, nearest, "more than one e4m3 step")
    if quant == "fake":
        got = torch.round(q.double() * s.double()[:, None])
        why = within_one_rounding(q, got / s.double()[:, None])
        if why:
            return f"out is not q / scale: {why}"
    else:
        got = q.double()
    q_lo = torch.round(v_lo.clamp(-128.0, 127.0))
    q_hi = torch.round(v_hi.clamp(-128.0, 127.0))
    return _first_bad(q, (got < q_lo) | (got > q_hi), q_lo, "not a rounding of y / s")


def _first_bad(q: torch.Tensor, bad: torch.Tensor, expected: torch.Tensor, what: str
               ) -> str | None:
    if not bad.any():
        return None
    i, j = (int(k) for k in bad.nonzero()[0])
    return (f"{int(bad.sum())}/{bad.numel()} values {what}; first at ({i}, {j}): got "
            f"{q[i, j].double().item():.6g}, expected {expected[i, j].item():.6g}")


class RMSNormQuantFwd(KernelSpec):
    name = "rmsnorm_quant_fwd"
    options: ClassVar[dict[str, tuple[str, ...]]] = {"quant": QUANT_MODES}

    def space(self, problem: Problem) -> dict[str, list]:
        return row_tiling_space(problem)

    def valid(self, problem: Problem, config: Config) -> bool:
        return valid_row_tiling(problem, config)

    def default(self, problem: Problem) -> Config:
        return default_row_tiling(problem)

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

    def run(self, inputs: Inputs, config: Config) -> Outputs:
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
