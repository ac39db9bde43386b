"""The public functions against float64 references, their gradients, torch.compile, and every
bad input getting a clear error: on the GPU where there is one, else under the interpreter."""

from __future__ import annotations

import warnings

import pytest
import torch

import kerneltune
from kerneltune.kernels import _spec, rmsnorm_quant_spec
from kerneltune.kernels._spec import compare_outputs
from kerneltune.kernels.add_rmsnorm_spec import add_rmsnorm_fwd_ref
from kerneltune.kernels.rmsnorm_fwd_spec import rmsnorm_fwd_ref
from kerneltune.runtime import ops

from .conftest import DEVICE, kt_warnings


def rand(*shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(DEVICE, dtype)


def ref_norm(x, w, eps, offset=0.0):
    y, _ = rmsnorm_fwd_ref(x.reshape(-1, x.shape[-1]), w, eps, offset)
    return y.reshape(x.shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_matches_reference(dtype, offset):
    x = rand(2, 3, 80, dtype=dtype)
    w = (1 + 0.2 * rand(80, seed=1)).to(dtype)
    y = kerneltune.rms_norm(x, w, 1e-5, offset)
    assert y.shape == x.shape and y.dtype == dtype
    assert compare_outputs([y], [ref_norm(x, w, 1e-5, offset)]) is None


def test_rms_norm_llama_and_gemma_semantics_match_hf_formulas():
    x, w = rand(4, 64), rand(64, seed=1)
    xf = x.double()
    xhat = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(kerneltune.rms_norm(x, w).double(), w.double() * xhat,
                               rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(kerneltune.rms_norm(x, w, offset=1.0).double(),
                               xhat * (1 + w.double()), rtol=1e-5, atol=1e-6)


def olmo2_formula(x, w, eps):
    """HF's Olmo2RMSNorm: x̂ in fp32, times the weight in fp32, rounded once."""
    xf = x.float()
    return (w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_gemma_rounding_at_offset_zero_is_olmo2s(dtype):
    """Bit for bit in half precision (in bf16 on a GPU: the interpreter truncates casts to
    bf16); in fp32, where the fp32 sums may differ in the last bit, both orders are one."""
    x = rand(3, 5, 64, dtype=dtype, scale=3.0)
    w = (0.5 + rand(64, seed=1)).to(dtype)
    w[::7] = 0.0  # zero weights give signed zeros, as OLMo2's product does
    w[1] = -1e-3
    y = kerneltune.rms_norm(x, w, 1e-6, casting_mode="gemma")
    llama = kerneltune.rms_norm(x, w, 1e-6, casting_mode="llama")
    assert torch.equal(llama, kerneltune.rms_norm(x, w, 1e-6))
    assert compare_outputs([y], [olmo2_formula(x.double(), w.double(), 1e-6)]) is None
    s, r = rand(3, 5, 64, dtype=dtype, seed=2), rand(3, 5, 64, dtype=dtype, seed=3)
    y_add, new_residual = kerneltune.add_rms_norm(s, r, w, 1e-6, casting_mode="gemma")
    if dtype == torch.float32:
        assert torch.equal(y, llama)
        return
    assert not torch.equal(llama, y)  # the probe's premise: the orders differ
    if dtype == torch.float16 or DEVICE != "cpu":
        expected = olmo2_formula(x, w, 1e-6)
        assert torch.equal(y, expected) and torch.equal(y.signbit(), expected.signbit())
        assert torch.equal(y_add, olmo2_formula(new_residual, w, 1e-6))


def test_gemma_rounding_at_offset_zero_gradients_against_float64():
    x64 = rand(4, 48, dtype=torch.float64, seed=3).requires_grad_()
    w64 = (1 + 0.3 * rand(48, dtype=torch.float64, seed=4)).requires_grad_()
    dy = rand(4, 48, dtype=torch.float64, seed=5)
    ref = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * w64
    dx_ref, dw_ref = torch.autograd.grad(ref, (x64, w64), dy)
    x = x64.detach().half().requires_grad_()
    w = w64.detach().half().requires_grad_()
    kerneltune.rms_norm(x, w, 1e-6, casting_mode="gemma").backward(dy.half())
    torch.testing.assert_close(x.grad.double(), dx_ref, rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(w.grad.double(), dw_ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"casting_mode": "none"}, r"unknown casting_mode 'none'; expected one of \('llama', "),
    ({"casting_mode": "llama", "offset": 1.0}, "casting_mode='llama' takes offset 0"),
])
def test_a_casting_mode_without_a_kernel_is_refused(kwargs, message):
    x, w = rand(2, 32), rand(32)
    with pytest.raises(ValueError, match=message):
        kerneltune.rms_norm(x, w, **kwargs)
    with pytest.raises(ValueError, match=message):
        kerneltune.add_rms_norm(x, x, w, **kwargs)
    with pytest.raises(ValueError, match=message):
        kerneltune.RMSNorm(32, **kwargs)


def test_strided_rows_and_non_contiguous_inputs():
    wide = rand(6, 100)
    x = wide[:, 10:74]  # strided rows, unit stride along N
    w = rand(64, seed=1)
    assert not x.is_contiguous()
    torch.testing.assert_close(kerneltune.rms_norm(x, w), kerneltune.rms_norm(x.contiguous(), w))
    xt = rand(64, 5).t()  # stride along N is not 1: copied
    torch.testing.assert_close(kerneltune.rms_norm(xt, w), kerneltune.rms_norm(xt.contiguous(), w))
    w_strided = rand(128, seed=2)[::2]
    torch.testing.assert_close(kerneltune.rms_norm(x, w_strided),
                               kerneltune.rms_norm(x, w_strided.contiguous()))


def test_zero_rows():
    x, w = torch.empty(0, 3, 32, device=DEVICE), rand(32)
    assert kerneltune.rms_norm(x, w).shape == (0, 3, 32)


@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_gradients_against_float64(offset):
    x64 = rand(3, 5, 48, dtype=torch.float64, seed=3).requires_grad_()
    w64 = (1 + 0.3 * rand(48, dtype=torch.float64, seed=4)).requires_grad_()
    dy = rand(3, 5, 48, dtype=torch.float64, seed=5)
    ref = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * (offset + w64)
    dx_ref, dw_ref = torch.autograd.grad(ref, (x64, w64), dy)
    x = x64.detach().float().requires_grad_()
    w = w64.detach().float().requires_grad_()
    y = kerneltune.rms_norm(x, w, 1e-6, offset)
    y.backward(dy.float())
    torch.testing.assert_close(x.grad.double(), dx_ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w.grad.double(), dw_ref, rtol=1e-4, atol=1e-5)


def test_gradient_only_for_x_and_through_a_strided_input():
    base = rand(4, 80, seed=6).requires_grad_()
    x = base[:, 8:72]
    w = rand(64, seed=7)
    kerneltune.rms_norm(x, w).sum().backward()
    xd = base.detach()[:, 8:72].double().requires_grad_()
    (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()).sum().backward()
    torch.testing.assert_close(base.grad[:, 8:72].double(), xd.grad, rtol=1e-4, atol=1e-5)
    assert base.grad[:, :8].abs().sum() == 0


def test_add_rms_norm_forward_and_gradients():
    x, res, w = rand(2, 4, 64, seed=1), rand(2, 4, 64, seed=2), 1 + 0.2 * rand(64, seed=3)
    y, s = kerneltune.add_rms_norm(x, res, w)
    y_ref, s_ref, _ = add_rmsnorm_fwd_ref(x.reshape(-1, 64), res.reshape(-1, 64), w, 1e-6)
    assert compare_outputs([y.reshape(-1, 64), s.reshape(-1, 64)], [y_ref, s_ref]) is None

    leaves = [t.double().requires_grad_() for t in (x, res, w)]
    s64 = leaves[0] + leaves[1]
    y64 = s64 * torch.rsqrt(s64.pow(2).mean(-1, keepdim=True) + 1e-6) * leaves[2]
    dy, ds = rand(2, 4, 64, seed=8), rand(2, 4, 64, seed=9)
    ref = torch.autograd.grad((y64, s64), leaves, (dy.double(), ds.double()))
    ours_in = [t.clone().requires_grad_() for t in (x, res, w)]
    y, s = kerneltune.add_rms_norm(*ours_in)
    ours = torch.autograd.grad((y, s), ours_in, (dy, ds))
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-5)


def test_rms_norm_quant_int8_and_fp8():
    x, w = rand(3, 2, 64, seed=1), 1 + 0.2 * rand(64, seed=2)
    for quant in ("int8", "fp8"):
        q, scale = kerneltune.rms_norm_quant(x, w, 1e-6, quant)
        assert q.shape == x.shape and scale.shape == (3, 2, 1) and scale.dtype == torch.float32
        assert q.dtype == (torch.int8 if quant == "int8" else torch.float8_e4m3fn)
        inputs = {"x": x.reshape(-1, 64), "weight": w, "bias": None, "eps": 1e-6, "quant": quant}
        assert rmsnorm_quant_spec.SPEC.check(inputs, (q.reshape(-1, 64), scale.reshape(-1))) is None
        deq = q.float() * scale
        torch.testing.assert_close(deq, ref_norm(x, w, 1e-6).float(), rtol=0.07, atol=0.05)


def test_rms_norm_fake_quant():
    x, gain, bias = rand(5, 64, seed=1), 1 + 0.2 * rand(64, seed=2), 0.1 * rand(64, seed=3)
    for g, b in ((None, None), (gain, None), (gain, bias)):
        out = kerneltune.rms_norm_fake_quant(x, g, b)
        assert out.shape == x.shape and out.dtype == x.dtype
        inputs = {"x": x, "weight": g, "bias": b, "eps": 1e-5, "quant": "fake"}
        _, scale = ops._rms_norm_quant_forward(x, g, b, 1e-5, "fake")
        assert rmsnorm_quant_spec.SPEC.check(inputs, (out, scale.reshape(-1))) is None


def test_no_grad_path_skips_autograd_but_grad_path_records():
    x, w = rand(4, 32).requires_grad_(), rand(32)
    with torch.no_grad():
        assert kerneltune.rms_norm(x, w).grad_fn is None
    assert kerneltune.rms_norm(x, w).grad_fn is not None


def _grads(fn, inputs, cotangents):
    leaves = [t.clone().requires_grad_() for t in inputs]
    outputs = fn(*leaves)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    used = [(o, c) for o, c in zip(outputs, cotangents, strict=True) if c is not None]
    return [o.grad_fn for o, _ in used], torch.autograd.grad(
        [o for o, _ in used], leaves, [c for _, c in used], allow_unused=True)


@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_eager_autograd_skips_the_dispatcher_with_the_ops_gradients(offset):
    """Eager calls record a plain autograd Function; its gradients are the custom op's, bit
    for bit (the same kernels, configs and saved tensors)."""
    x, w, dy = rand(3, 48, seed=1), 1 + 0.2 * rand(48, seed=2), rand(3, 48, seed=3)
    (fn,), ours = _grads(lambda a, b: kerneltune.rms_norm(a, b, 1e-6, offset), (x, w), [dy])
    _, theirs = _grads(lambda a, b: ops.rms_norm_op(a, b, 1e-6, offset)[0], (x, w), [dy])
    assert type(fn).__name__ == "_RMSNormFunctionBackward"
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)


def test_a_second_derivative_is_a_clear_error():
    x, w = rand(3, 48, seed=1).requires_grad_(), (1 + 0.2 * rand(48, seed=2)).requires_grad_()
    dy = rand(3, 48, seed=3).requires_grad_()
    (dx,) = torch.autograd.grad(kerneltune.rms_norm(x, w), x, dy, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        dx.sum().backward()


@pytest.mark.parametrize("used", ["both", "y", "s"])
def test_eager_add_rms_norm_gradients_are_the_ops_whichever_outputs_are_used(used):
    x, res, w = rand(2, 3, 64, seed=1), rand(2, 3, 64, seed=2), 1 + 0.2 * rand(64, seed=3)
    dy, ds = rand(2, 3, 64, seed=4), rand(2, 3, 64, seed=5)
    cot = [dy if used != "s" else None, ds if used != "y" else None]
    fns, ours = _grads(lambda *a: kerneltune.add_rms_norm(*a), (x, res, w), cot)
    _, theirs = _grads(lambda *a: ops.add_rms_norm_op(*a, 1e-6, 0.0)[:2], (x, res, w), cot)
    assert {type(f).__name__ for f in fns} == {"_AddRMSNormFunctionBackward"}
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b) if a is not None else not b.any()
    # Where y takes no gradient, none reaches the weight (as for torch's own ops), where the
    # op's autograd ran the backward on a zero dy.
    assert (ours[2] is None) == (used == "s")


# --------------------------------------------------------------------------- compile


def test_custom_ops_pass_opcheck():
    x, w = rand(3, 32).requires_grad_(), rand(32).requires_grad_()
    torch.library.opcheck(ops.rms_norm_op, (x, w, 1e-6, 0.0))
    torch.library.opcheck(ops.rms_norm_op, (x, w, 1e-6, 1.0))
    torch.library.opcheck(ops.add_rms_norm_op, (x, rand(3, 32, seed=1).requires_grad_(), w,
                                                1e-6, 0.0))
    torch.library.opcheck(ops.rms_norm_quant_op, (x.detach(), w.detach(), None, 1e-6, "int8"))
    torch.library.opcheck(ops.rms_norm_quant_op, (x.detach(), None, None, 1e-5, "fake"))


class Block(torch.nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.norm = kerneltune.RMSNorm(n)
        self.proj = torch.nn.Linear(n, n)
        torch.nn.init.normal_(self.norm.weight, 1.0, 0.2)

    def forward(self, x, residual):
        h, residual = kerneltune.add_rms_norm(x, residual, self.norm.weight)
        return self.norm(self.proj(h)) + residual


@pytest.mark.parametrize("mode", ["native", "kernels"])
def test_torch_compile_fullgraph_forward_and_backward(mode, monkeypatch):
    monkeypatch.setenv("KERNELTUNE_COMPILE", mode)
    torch._dynamo.reset()
    block = Block(32).to(DEVICE)
    x, res = rand(2, 3, 32, seed=1), rand(2, 3, 32, seed=2)
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    out = compiled(x, res)
    torch.testing.assert_close(out, block(x, res))
    out.sum().backward()
    grads = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    block(x, res).sum().backward()
    for a, p in zip(grads, block.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad)
    with torch.no_grad():
        q = torch.compile(lambda t: kerneltune.rms_norm_quant(t, block.norm.weight),
                          backend="aot_eager", fullgraph=True)(x)
    assert q[0].dtype == torch.int8


def kerneltune_ops_traced(fn, *args) -> set[str]:
    """The kerneltune custom ops in the graph torch.compile makes of fn(*args)."""
    torch._dynamo.reset()
    seen: set[str] = set()

    def backend(gm, _inputs):
        seen.update(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return {t.split(".")[1] for t in seen if t.startswith("kerneltune.")}


def norms_and_quant(x, r, w):
    return (kerneltune.rms_norm(x, w), kerneltune.add_rms_norm(x, r, w)[0],
            kerneltune.layer_norm(x, w), kerneltune.rms_norm_quant(x, w)[0])


@pytest.mark.parametrize("mode, expected", [
    (None, {"rms_norm_quant"}),  # the norms trace the formula Inductor fuses
    ("native", {"rms_norm_quant"}),
    ("kernels", {"rms_norm", "add_rms_norm", "layer_norm", "rms_norm_quant"}),
])
def test_compile_mode_picks_what_the_norms_trace(mode, expected, monkeypatch):
    if mode is None:
        monkeypatch.delenv("KERNELTUNE_COMPILE", raising=False)
    else:
        monkeypatch.setenv("KERNELTUNE_COMPILE", mode)
    x, r, w = rand(4, 32), rand(4, 32, seed=1), rand(32, seed=2)
    assert kerneltune_ops_traced(norms_and_quant, x, r, w) == expected


def test_an_unknown_compile_mode_is_named(monkeypatch):
    monkeypatch.setenv("KERNELTUNE_COMPILE", "inductor")
    with pytest.raises(Exception, match="KERNELTUNE_COMPILE='inductor': expected one of"):
        kerneltune_ops_traced(kerneltune.rms_norm, rand(4, 32), rand(32))


# ---------------------------------------------------------------------------- errors


def bad_calls():
    x, w = rand(4, 32), rand(32)
    return [
        ("weight size", ValueError, r"weight has shape \(31,\), expected \(32,\)",
         lambda: kerneltune.rms_norm(x, rand(31))),
        ("weight 2-D", ValueError, "weight has shape",
         lambda: kerneltune.rms_norm(x, rand(1, 32))),
        ("mixed devices", ValueError, f"weight is on meta but the input is on {DEVICE}",
         lambda: kerneltune.rms_norm(x, torch.empty(32, device="meta"))),
        ("integer x", TypeError, "x has dtype torch.int32",
         lambda: kerneltune.rms_norm(x.to(torch.int32), w)),
        ("float64 x", TypeError, "x has dtype torch.float64",
         lambda: kerneltune.rms_norm(x.double(), w)),
        ("integer weight", TypeError, "weight has dtype torch.int64",
         lambda: kerneltune.rms_norm(x, torch.ones(32, dtype=torch.int64, device=DEVICE))),
        ("not a tensor", TypeError, "x must be a torch.Tensor, got list",
         lambda: kerneltune.rms_norm([1.0, 2.0], w)),
        ("empty last dim", ValueError, "empty last dimension",
         lambda: kerneltune.rms_norm(torch.empty(4, 0, device=DEVICE),
                                     torch.empty(0, device=DEVICE))),
        ("scalar x", ValueError, "at least one dimension",
         lambda: kerneltune.rms_norm(torch.tensor(1.0, device=DEVICE), w)),
        ("nan eps", ValueError, "eps must be a finite number, got nan",
         lambda: kerneltune.rms_norm(x, w, float("nan"))),
        ("inf eps", ValueError, "eps must be a finite number, got inf",
         lambda: kerneltune.rms_norm(x, w, float("inf"))),
        ("negative eps", ValueError, "eps must be >= 0",
         lambda: kerneltune.rms_norm(x, w, -1.0)),
        ("nan offset", ValueError, "offset must be a finite number",
         lambda: kerneltune.rms_norm(x, w, 1e-6, float("nan"))),
        ("residual shape", ValueError, r"residual has shape \(4, 16\)",
         lambda: kerneltune.add_rms_norm(x, rand(4, 16), w)),
        ("residual dtype", TypeError, "residual has dtype torch.float16",
         lambda: kerneltune.add_rms_norm(x, x.half(), w)),
        ("residual device", ValueError, "residual is on meta",
         lambda: kerneltune.add_rms_norm(x, torch.empty(4, 32, device="meta"), w)),
        ("unknown quant", ValueError, "unknown quant mode 'int4'",
         lambda: kerneltune.rms_norm_quant(x, w, quant="int4")),
        ("quant weight size", ValueError, "weight has shape",
         lambda: kerneltune.rms_norm_quant(x, rand(8))),
        ("quant eps", ValueError, "eps must be a finite number",
         lambda: kerneltune.rms_norm_quant(x, w, float("nan"))),
        ("fake gain size", ValueError, r"gain has shape \(8,\)",
         lambda: kerneltune.rms_norm_fake_quant(x, rand(8))),
        ("fake bias dtype", TypeError, "bias has dtype torch.int64",
         lambda: kerneltune.rms_norm_fake_quant(
             x, None, torch.zeros(32, dtype=torch.int64, device=DEVICE))),
        ("fake integer x", TypeError, "x has dtype torch.int8",
         lambda: kerneltune.rms_norm_fake_quant(x.to(torch.int8))),
    ]


@pytest.mark.parametrize("case", bad_calls(), ids=lambda c: c[0])
def test_bad_input_gets_a_clear_error(case):
    _, error, message, call = case
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("call", [
    lambda x, w: kerneltune.rms_norm(x, w),
    lambda x, w: kerneltune.rms_norm(x, w, offset=1.0),
    lambda x, w: kerneltune.rms_norm(x.half(), w.half(), casting_mode="gemma"),
    lambda x, w: kerneltune.add_rms_norm(x, x, w),
    lambda x, w: kerneltune.rms_norm_quant(x, w, quant="fp8"),
    lambda x, w: kerneltune.rms_norm_fake_quant(x, w),
    lambda x, w: kerneltune.RMSNorm(32).requires_grad_(False)(x),
], ids=["rms_norm", "gemma", "olmo2", "add_rms_norm", "rms_norm_quant", "rms_norm_fake_quant",
        "RMSNorm"])
def test_a_cpu_tensor_off_the_interpreter_computes_the_torch_formula(call, monkeypatch):
    """Where Triton compiles for a GPU, a CPU tensor never reaches a launch: its call computes
    the torch formula (what the kernels compute), with one warning."""
    if DEVICE != "cpu":
        pytest.skip("compares with the kernels under the interpreter")
    x, w = rand(4, 32), 1 + 0.2 * rand(32, seed=1)
    expected = call(x, w)
    monkeypatch.setattr(_spec, "interpreting", lambda: False)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got, again = call(x, w), call(x, w)
    def outputs(result):
        return (result,) if isinstance(result, torch.Tensor) else tuple(result)

    assert compare_outputs(outputs(got), outputs(expected)) is None
    torch.testing.assert_close(again, got, rtol=0, atol=0)
    assert kt_warnings(record) == ["kerneltune: the kernels do not run on cpu tensors (they need "
                                   "a CUDA device, or the CPU with TRITON_INTERPRET=1); computing "
                                   "the torch formula instead"]


def test_fp8_without_float8_support_is_a_clear_error(monkeypatch):
    monkeypatch.delattr(torch, "float8_e4m3fn")
    with pytest.raises(TypeError, match=r"quant='fp8' needs torch\.float8_e4m3fn"):
        kerneltune.rms_norm_quant(rand(2, 32), rand(32), quant="fp8")
