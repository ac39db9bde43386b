"""The implementations kerneltune is measured against, per kernel.

Each peer turns one input set (the dict a kernel spec's `make_inputs` returns) into a zero-argument
callable computing the same outputs as the kernel, so every implementation is timed the same way
over the same rotating inputs. Peers whose package is missing are left out with a note.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

import one_row

Inputs = dict[str, Any]
Call = Callable[[], Any]


Bind = Callable[[Inputs], Call]


@dataclass
class Peer:
    name: str
    #: Called once per shape (e.g. a fresh torch.compile); returns the function that turns one
    #: input set into the call to time.
    prepare: Callable[[], Bind]


def plain(bind: Bind) -> Callable[[], Bind]:
    """A peer with no per-shape set-up."""
    return lambda: bind


# ------------------------------------------------------------------- plain torch formulas


def hf_rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """HF LlamaRMSNorm.forward."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def rmsnorm_bwd_formula(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, rstd: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Closed-form backward of the llama forward (what autograd computes, fused by hand)."""
    xf, r = x.float(), rstd.float().unsqueeze(-1)
    xhat = xf * r
    g = dy.float() * w.float()
    dx = r * (g - xhat * (g * xhat).mean(-1, keepdim=True))
    dw = (dy.float() * xhat.to(x.dtype).float()).sum(0)
    return dx.to(x.dtype), dw.to(w.dtype)


def add_rmsnorm_formula(x: torch.Tensor, res: torch.Tensor, w: torch.Tensor, eps: float
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    s = x + res
    return hf_rmsnorm(s, w, eps), s


def quant_formula(x: torch.Tensor, w: torch.Tensor, eps: float, quant: str
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row dynamic quantisation of the llama RMSNorm output (vLLM's per-token formulas)."""
    y = hf_rmsnorm(x, w, eps).float()
    amax = y.abs().amax(-1, keepdim=True)
    if quant == "int8":
        s = torch.clamp(amax / 127.0, min=torch.finfo(torch.float32).eps)
        q = torch.round(y / s).clamp(-128, 127).to(torch.int8)
    else:
        s = torch.clamp(amax / 448.0, min=1.0 / (448.0 * 512.0))
        q = (y / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q, s.squeeze(-1)


def fake_quant_formula(x: torch.Tensor, gain: torch.Tensor | None, bias: torch.Tensor | None,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    z = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    if gain is not None:
        z = z * gain.float()
    if bias is not None:
        z = z + bias.float()
    scale = 127.0 / z.abs().amax(-1, keepdim=True).clamp(min=eps)
    out = torch.round(z * scale).clamp(-128, 127) / scale
    return out.to(x.dtype), scale.squeeze(-1)


def layernorm_formula(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, mean, rstd): the statistics and the affine in fp32, y rounded once to x's dtype (the
    biased variance, as F.layer_norm)."""
    xf = x.float()
    mean = xf.mean(-1)
    xc = xf - mean.unsqueeze(-1)
    rstd = torch.rsqrt(xc.pow(2).mean(-1) + eps)
    y = xc * rstd.unsqueeze(-1) * w.float() + b.float()
    return y.to(x.dtype), mean, rstd


def layernorm_bwd_formula(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                          mean: torch.Tensor, rstd: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Closed-form (dx, dw, db) of the layer-norm forward from its saved mean and rstd, in fp32,
    each rounded to the dtype of its tensor."""
    r = rstd.float().unsqueeze(-1)
    xhat = (x.float() - mean.float().unsqueeze(-1)) * r
    dyf = dy.float()
    wdy = dyf * w.float()
    c1 = (xhat * wdy).mean(-1, keepdim=True)
    c2 = wdy.mean(-1, keepdim=True)
    dx = (wdy - (xhat * c1 + c2)) * r
    return dx.to(x.dtype), (dyf * xhat).sum(0).to(w.dtype), dyf.sum(0).to(b.dtype)


#: Per group-quant mode: the largest quantised magnitude and the smallest scale (vLLM's).
GROUP_QUANT = {"int8": (127.0, float(torch.finfo(torch.float32).eps)),
               "fp8": (448.0, 1.0 / (448.0 * 512.0))}


def group_quant_formula(x: torch.Tensor, res: torch.Tensor | None, w: torch.Tensor, eps: float,
                        quant: str, group_size: int | None, ue8m0: bool, column_major: bool
                        ) -> tuple[torch.Tensor, ...]:
    """The llama RMSNorm of x (+ res) quantised per group of `group_size` columns (None: one
    group a row), vLLM's `rms_norm_per_block_quant`: (q, scales (M, N / group)[, x + res]),
    the scales powers of two with `ue8m0` and column-major with `column_major`."""
    s = x if res is None else (x.float() + res.float()).to(x.dtype)
    y = hf_rmsnorm(s, w, eps).float()
    m, n = y.shape
    size = group_size or n
    groups = y.reshape(m, n // size, size)
    qmax, floor = GROUP_QUANT[quant]
    scale = (groups.abs().amax(-1) / qmax).clamp(min=floor)
    if ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    v = groups / scale.unsqueeze(-1)
    if quant == "int8":
        q = torch.round(v).clamp(-128, 127).to(torch.int8)
    else:
        q = v.clamp(-qmax, qmax).to(torch.float8_e4m3fn)
    if column_major:  # what a GEMM reading the scales by column wants (DeepGEMM's layout)
        scale = scale.t().contiguous().t()
    out = (q.reshape(m, n), scale)
    return out if res is None else (*out, s)


# ------------------------------------------------------------------------------- helpers


def compiled(fn: Callable[..., Any]) -> Callable[[], Callable[..., Any]]:
    """A fresh torch.compile of `fn` per shape, so no recompile limit is hit across the suite."""

    def prepare() -> Callable[..., Any]:
        torch._dynamo.reset()
        return torch.compile(fn, dynamic=False, fullgraph=True)

    return prepare


def _liger() -> Any | None:
    try:
        from liger_kernel.ops import fused_add_rms_norm, rms_norm
    except ImportError:
        return None
    return rms_norm, fused_add_rms_norm


#: The distributions of the peers, whose versions a result records.
PEER_PACKAGES = ("liger-kernel", "quack-kernels", "nvidia-cutlass-dsl", "vllm")


def peer_versions() -> dict[str, str]:
    """The installed version of each peer package found here."""
    found = {}
    for name in PEER_PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _quack() -> Any | None:
    """QuACK's RMSNorm (CuTe DSL, CUDA only): its forward (with the residual as an argument)
    and backward, called as its autograd function calls them."""
    if not torch.cuda.is_available():
        return None
    try:
        from quack.rmsnorm import rmsnorm_bwd, rmsnorm_fwd
    except ImportError:
        return None
    return rmsnorm_fwd, rmsnorm_bwd


def _liger_layer_norm() -> Any | None:
    """Liger-Kernel's LayerNorm module (its `layer_norm_forward(X, W, B, eps)` and
    `layer_norm_backward(dY, X, W, B, Mean, RSTD)`)."""
    try:
        from liger_kernel.ops import layer_norm
    except ImportError:
        return None
    ok = hasattr(layer_norm, "layer_norm_forward") and hasattr(layer_norm, "layer_norm_backward")
    return layer_norm if ok else None


def _quack_layer_norm() -> Any | None:
    """QuACK's LayerNorm forward and backward (CuTe DSL, CUDA only)."""
    if not torch.cuda.is_available():
        return None
    try:
        from quack.rmsnorm import layernorm_bwd, layernorm_fwd
    except ImportError:
        return None
    return layernorm_fwd, layernorm_bwd


def _vllm_group_quant() -> Any | None:
    """vLLM's fused RMSNorm + per-group quant, `rms_norm_per_block_quant` (CUDA only)."""
    if not torch.cuda.is_available():
        return None
    try:
        from vllm import _custom_ops as ops
    except Exception:  # ImportError, or a build for another torch or CUDA failing to load
        return None
    return getattr(ops, "rms_norm_per_block_quant", None)


# ------------------------------------------------------------------------------- per kernel


def _fwd_peers() -> list[Peer]:
    peers = [
        Peer("torch-eager", plain(lambda i: lambda: hf_rmsnorm(i["x"], i["weight"], i["eps"]))),
        Peer("F.rms_norm", plain(lambda i: lambda: F.rms_norm(
            i["x"], (i["x"].shape[-1],), i["weight"], i["eps"]))),
    ]
    prep = compiled(hf_rmsnorm)

    def compile_fwd() -> Callable[[Inputs], Call]:
        fn = prep()
        return lambda i: lambda: fn(i["x"], i["weight"], i["eps"])

    peers.append(Peer("torch.compile", compile_fwd))
    peers.append(Peer("triton one-row", plain(lambda i: lambda: one_row.rms_norm(
        i["x"], i["weight"], i["eps"]))))
    liger = _liger()
    if liger:
        rms, _ = liger
        peers.append(Peer("liger", plain(lambda i: lambda: rms.rms_norm_forward(
            i["x"], i["weight"], i["eps"], 0.0, "llama", None)[0])))
    quack = _quack()
    if quack:
        fwd, _ = quack
        peers.append(Peer("quack", plain(lambda i: lambda: fwd(
            i["x"], i["weight"], eps=i["eps"])[0])))
    return peers


def _bwd_peers() -> list[Peer]:
    peers = [Peer("torch-eager", plain(lambda i: lambda: rmsnorm_bwd_formula(
        i["dy"], i["x"], i["weight"], i["rstd"])))]
    prep = compiled(rmsnorm_bwd_formula)

    def compile_bwd() -> Callable[[Inputs], Call]:
        fn = prep()
        return lambda i: lambda: fn(i["dy"], i["x"], i["weight"], i["rstd"])

    peers.append(Peer("torch.compile", compile_bwd))
    peers.append(Peer("triton one-row", plain(lambda i: lambda: one_row.rms_norm_backward(
        i["dy"], i["x"], i["weight"], i["rstd"]))))
    liger = _liger()
    if liger:
        rms, _ = liger

        from liger_kernel.ops.utils import calculate_settings

        def liger_bwd(i: Inputs) -> Call:
            block, warps = calculate_settings(i["x"].shape[-1])  # what its forward would save
            return lambda: rms.rms_norm_backward(i["dy"], i["x"], i["weight"], i["rstd"], 0.0, 0,
                                                 block, warps, True, None)

        peers.append(Peer("liger", plain(liger_bwd)))
    quack = _quack()
    if quack:
        _, bwd = quack
        peers.append(Peer("quack", plain(lambda i: lambda: bwd(
            i["x"], i["weight"], i["dy"], i["rstd"])[:2])))
    return peers


def _add_peers() -> list[Peer]:
    peers = [Peer("torch-eager", plain(lambda i: lambda: add_rmsnorm_formula(
        i["x"], i["residual"], i["weight"], i["eps"])))]
    prep = compiled(add_rmsnorm_formula)

    def compile_add() -> Callable[[Inputs], Call]:
        fn = prep()
        return lambda i: lambda: fn(i["x"], i["residual"], i["weight"], i["eps"])

    peers.append(Peer("torch.compile", compile_add))
    liger = _liger()
    if liger:
        _, fused = liger
        peers.append(Peer("liger", plain(lambda i: lambda: fused.fused_add_rms_norm_forward(
            i["x"], i["residual"], i["weight"], i["eps"], 0.0, "llama")[:2])))
    quack = _quack()
    if quack:
        fwd, _ = quack
        peers.append(Peer("quack", plain(lambda i: lambda: fwd(
            i["x"], i["weight"], residual=i["residual"], eps=i["eps"])[:2])))
    return peers


def _quant_peers() -> list[Peer]:
    def eager(i: Inputs) -> Call:
        if i["quant"] == "fake":
            return lambda: fake_quant_formula(i["x"], i["weight"], i["bias"], i["eps"])
        return lambda: quant_formula(i["x"], i["weight"], i["eps"], i["quant"])

    prep_q, prep_f = compiled(quant_formula), compiled(fake_quant_formula)

    def compile_quant() -> Callable[[Inputs], Call]:
        fq, ff = prep_q(), prep_f()

        def bind(i: Inputs) -> Call:
            if i["quant"] == "fake":
                return lambda: ff(i["x"], i["weight"], i["bias"], i["eps"])
            return lambda: fq(i["x"], i["weight"], i["eps"], i["quant"])

        return bind

    return [Peer("torch-eager", plain(eager)), Peer("torch.compile", compile_quant)]


def _layernorm_fwd_peers() -> list[Peer]:
    def layer_norm(i: Inputs) -> Call:
        n = i["x"].shape[-1]
        # F.layer_norm's kernel, whose full form also returns the mean and rstd it computes
        return lambda: torch.native_layer_norm(i["x"], (n,), i["weight"], i["bias"], i["eps"])

    peers = [Peer("torch-eager", plain(lambda i: lambda: layernorm_formula(
                 i["x"], i["weight"], i["bias"], i["eps"]))),
             Peer("F.layer_norm", plain(layer_norm))]
    prep = compiled(layernorm_formula)

    def compile_fwd() -> Callable[[Inputs], Call]:
        fn = prep()
        return lambda i: lambda: fn(i["x"], i["weight"], i["bias"], i["eps"])

    peers.append(Peer("torch.compile", compile_fwd))
    liger = _liger_layer_norm()
    if liger:
        def liger_fwd(i: Inputs) -> Call:
            def call() -> tuple[torch.Tensor, ...]:
                y, _, mean, rstd, *_ = liger.layer_norm_forward(
                    i["x"], i["weight"], i["bias"], i["eps"])
                return y, mean, rstd  # mean and rstd in x's dtype, as Liger keeps them

            return call

        peers.append(Peer("liger", plain(liger_fwd)))
    quack = _quack_layer_norm()
    if quack:
        fwd, _ = quack

        def quack_fwd(i: Inputs) -> Call:
            # QuACK takes the weight and bias in fp32 only: converted once, outside the timing
            w, b = i["weight"].float(), i["bias"].float()

            def call() -> tuple[torch.Tensor, ...]:
                y, rstd, mean = fwd(i["x"], w, b, eps=i["eps"], return_rstd=True,
                                    return_mean=True)
                return y, mean, rstd

            return call

        peers.append(Peer("quack", plain(quack_fwd)))
    return peers


def _layernorm_bwd_peers() -> list[Peer]:
    def args(i: Inputs) -> tuple:
        return i["dy"], i["x"], i["weight"], i["bias"], i["mean"], i["rstd"]

    peers = [Peer("torch-eager", plain(lambda i: lambda: layernorm_bwd_formula(*args(i))))]
    prep = compiled(layernorm_bwd_formula)

    def compile_bwd() -> Callable[[Inputs], Call]:
        fn = prep()
        return lambda i: lambda: fn(*args(i))

    peers.append(Peer("torch.compile", compile_bwd))
    liger = _liger_layer_norm()
    if liger:
        peers.append(Peer("liger", plain(lambda i: lambda: liger.layer_norm_backward(
            *args(i)))))
    quack = _quack_layer_norm()
    if quack:
        _, bwd = quack
        peers.append(Peer("quack", plain(lambda i: lambda: bwd(
            i["x"], i["weight"], i["dy"], i["rstd"], i["mean"], has_bias=True))))
    return peers


def _group_quant_peers() -> list[Peer]:
    def args(i: Inputs) -> tuple:
        return (i["x"], i.get("residual"), i["weight"], i["eps"], i["quant"], i["group_size"],
                i["scale_ue8m0"], i["column_major_scales"])

    peers = [Peer("torch-eager", plain(lambda i: lambda: group_quant_formula(*args(i))))]
    prep = compiled(group_quant_formula)

    def compile_group() -> Callable[[Inputs], Call]:
        fn = prep()
        return lambda i: lambda: fn(*args(i))

    peers.append(Peer("torch.compile", compile_group))
    vllm = _vllm_group_quant()
    if vllm:
        def vllm_bind(i: Inputs) -> Call:
            if i["scale_ue8m0"]:  # not one of its options: the row reports it
                raise ValueError("vLLM's rms_norm_per_block_quant has no UE8M0 scales")
            x, res = i["x"], i.get("residual")
            qtype = torch.int8 if i["quant"] == "int8" else torch.float8_e4m3fn
            group = i["group_size"] or x.shape[-1]

            def call() -> tuple[torch.Tensor, ...]:
                # With a residual, vLLM writes x + residual into it in place: the new residual
                q, scales = vllm(x, i["weight"], i["eps"], qtype, [1, group], residual=res,
                                 is_scale_transposed=i["column_major_scales"])
                return (q, scales) if res is None else (q, scales, res)

            return call

        peers.append(Peer("vllm", plain(vllm_bind)))
    return peers


PEERS: dict[str, Callable[[], list[Peer]]] = {
    "rmsnorm_fwd": _fwd_peers,
    "rmsnorm_bwd": _bwd_peers,
    "add_rmsnorm_fwd": _add_peers,
    "rmsnorm_quant_fwd": _quant_peers,
    "layernorm_fwd": _layernorm_fwd_peers,
    "layernorm_bwd": _layernorm_bwd_peers,
    "rmsnorm_group_quant_fwd": _group_quant_peers,
    "add_rmsnorm_group_quant_fwd": _group_quant_peers,
}
