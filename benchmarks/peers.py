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
PEER_PACKAGES = ("liger-kernel", "quack-kernels", "nvidia-cutlass-dsl")


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


PEERS: dict[str, Callable[[], list[Peer]]] = {
    "rmsnorm_fwd": _fwd_peers,
    "rmsnorm_bwd": _bwd_peers,
    "add_rmsnorm_fwd": _add_peers,
    "rmsnorm_quant_fwd": _quant_peers,
}
