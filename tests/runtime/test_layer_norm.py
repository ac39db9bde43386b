"""`layer_norm` and `LayerNorm` against float64 torch, their gradients, torch.compile, the
config resolved from a table, and bad input getting a clear error: on the GPU where there is
one, else under the interpreter."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import kerneltune
from kerneltune.kernels import _spec
from kerneltune.kernels._spec import SLACK, within_one_rounding
from kerneltune.kernels.layernorm_spec import BWD, FWD, forward_error_bounds, layernorm_fwd_ref
from kerneltune.runtime.layer_norm import layer_norm_op
from kerneltune.table import Entry, Table, dumps

from .conftest import DEVICE, GPU, kt_warnings


def rand(*shape, dtype=torch.float32, seed=0, mean=0.0):
    g = torch.Generator().manual_seed(seed)
    return (mean + torch.randn(*shape, generator=g, dtype=torch.float64)).to(DEVICE, dtype)


def off_by(y, x, w, b, eps=1e-5) -> str | None:
    """Why y is not x's layer norm within its dtype's rounding and the kernel's fp32 error
    bounds (None if it is)."""
    x2 = x.reshape(-1, x.shape[-1])
    ref, mean, rstd = layernorm_fwd_ref(x2, w, b, eps)
    bound = forward_error_bounds(x2, w, b, eps, mean, rstd)[0]
    return within_one_rounding(y.reshape(x2.shape), ref, slack=SLACK[y.dtype], extra=bound)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 3, 80), (5, 7), (1, 1)])
def test_layer_norm_matches_torch(dtype, shape):
    n = shape[-1]
    x = rand(*shape, dtype=dtype, mean=1.0)
    w, b = (1 + 0.2 * rand(n, seed=1)).to(dtype), rand(n, seed=2).to(dtype)
    y = kerneltune.layer_norm(x, w, b)
    assert y.shape == x.shape and y.dtype == dtype
    assert off_by(y, x, w, b) is None
    expected = F.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5)
    assert within_one_rounding(y, expected, slack=4 * SLACK[dtype],
                               extra=1e-5 if dtype == torch.float32 else 0.0) is None


@pytest.mark.parametrize(("weight", "bias"), [(False, False), (True, False), (False, True)])
def test_weight_and_bias_are_optional(weight, bias):
    x = rand(4, 100, mean=2.0)
    w = 1 + 0.2 * rand(100, seed=1) if weight else None
    b = rand(100, seed=2) if bias else None
    assert off_by(kerneltune.layer_norm(x, w, b, eps=1e-3), x, w, b, 1e-3) is None


def test_strided_rows_and_a_long_row():
    wide = rand(6, 300, mean=1.0)
    x = wide[:, 50:250]  # rows strided by 300
    w, b = rand(200, seed=1), rand(200, seed=2)
    assert off_by(kerneltune.layer_norm(x, w, b), x, w, b) is None
    transposed = rand(40, 3, seed=3).t()  # no unit stride along N: copied
    assert off_by(kerneltune.layer_norm(transposed), transposed, None, None) is None
    long = rand(2, 20000, dtype=torch.bfloat16, seed=4)  # looped by default
    assert not FWD.default(FWD.problem(2, 20000)).SINGLE
    assert off_by(kerneltune.layer_norm(long), long, None, None) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_gradients_match_float64_autograd(dtype, affine):
    x = rand(2, 5, 96, dtype=dtype, mean=1.0).requires_grad_()
    w = (1 + 0.2 * rand(96, seed=1)).to(dtype).requires_grad_() if affine != "none" else None
    b = rand(96, seed=2).to(dtype).requires_grad_() if affine == "both" else None
    dy = rand(2, 5, 96, dtype=dtype, seed=3)
    kerneltune.layer_norm(x, w, b).backward(dy)
    leaves = [t for t in (x, w, b) if t is not None]
    ours = [t.grad for t in leaves]
    copies = [t.detach().double().requires_grad_() for t in leaves]
    x64, rest = copies[0], copies[1:]
    F.layer_norm(x64, (96,), rest[0] if w is not None else None,
                 rest[-1] if b is not None else None, 1e-5).backward(dy.double())
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    for got, leaf, copy in zip(ours, leaves, copies, strict=True):
        assert got.dtype == leaf.dtype
        torch.testing.assert_close(got.double(), copy.grad, **tol)


def test_only_the_inputs_that_need_it_get_a_gradient():
    x, w, b = rand(3, 32).requires_grad_(), rand(32, seed=1), rand(32, seed=2).requires_grad_()
    kerneltune.layer_norm(x, w, b).sum().backward()
    assert x.grad is not None and w.grad is None
    torch.testing.assert_close(b.grad, torch.full_like(b, 3.0))


def test_the_module_is_torchs_layer_norm():
    torch_norm = torch.nn.LayerNorm(48, eps=1e-6).to(DEVICE)
    with torch.no_grad():
        torch_norm.weight.normal_(1.0, 0.2)
        torch_norm.bias.normal_(0.0, 0.5)
    ours = kerneltune.LayerNorm(48, eps=1e-6, device=DEVICE)
    assert ours.state_dict().keys() == torch_norm.state_dict().keys()
    ours.load_state_dict(torch_norm.state_dict())
    shared = kerneltune.LayerNorm.from_torch(torch_norm)
    assert shared.weight is torch_norm.weight and shared.bias is torch_norm.bias
    assert (shared.normalized_shape, shared.eps) == ((48,), 1e-6)
    x = rand(3, 4, 48, mean=1.0)
    for module in (ours, shared):
        y = module(x)
        assert off_by(y, x, torch_norm.weight.detach(), torch_norm.bias.detach(), 1e-6) is None
    shared(x).sum().backward()
    assert torch_norm.weight.grad is not None and torch_norm.bias.grad is not None


@pytest.mark.parametrize("kwargs", [{"elementwise_affine": False}, {"bias": False}])
def test_the_module_without_weight_or_bias(kwargs):
    torch_norm = torch.nn.LayerNorm(16, **kwargs)
    ours = kerneltune.LayerNorm(16, **kwargs)
    assert ours.state_dict().keys() == torch_norm.state_dict().keys()
    assert repr(ours).replace("kerneltune.", "") == repr(torch_norm)
    x = rand(5, 16, mean=1.0)
    expected = torch_norm.to(DEVICE)(x)
    torch.testing.assert_close(ours.to(DEVICE)(x), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kerneltune.LayerNorm.from_torch(torch_norm)(x), expected,
                               rtol=1e-5, atol=1e-5)


def test_the_module_normalizes_over_several_trailing_dimensions():
    torch_norm = torch.nn.LayerNorm((4, 6)).to(DEVICE)
    with torch.no_grad():
        torch_norm.weight.normal_(1.0, 0.2)
    x = rand(3, 4, 6, mean=1.0)
    torch.testing.assert_close(kerneltune.LayerNorm.from_torch(torch_norm)(x), torch_norm(x),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"does not end in normalized_shape \(4, 6\)"):
        kerneltune.LayerNorm((4, 6))(rand(3, 6, 4))
    with pytest.raises(TypeError, match=r"expected a torch\.nn\.LayerNorm"):
        kerneltune.LayerNorm.from_torch(torch.nn.Linear(2, 2))


def test_custom_ops_pass_opcheck():
    x, w, b = rand(3, 32, mean=1.0).requires_grad_(), rand(32, seed=1), rand(32, seed=2)
    torch.library.opcheck(layer_norm_op, (x, w.requires_grad_(), b.requires_grad_(), 1e-5))
    torch.library.opcheck(layer_norm_op, (x, None, None, 1e-5))


def test_torch_compile_fullgraph_forward_and_backward():
    torch._dynamo.reset()
    norm = kerneltune.LayerNorm(32).to(DEVICE)
    proj = torch.nn.Linear(32, 32).to(DEVICE)

    def block(x):
        return norm(proj(x)) + kerneltune.layer_norm(x)

    x = rand(2, 3, 32, seed=1, mean=1.0)
    out = torch.compile(block, backend="aot_eager", fullgraph=True)(x)
    torch.testing.assert_close(out, block(x))
    out.sum().backward()
    grads = [p.grad.clone() for p in (*norm.parameters(), *proj.parameters())]
    for p in (*norm.parameters(), *proj.parameters()):
        p.grad = None
    block(x).sum().backward()
    for a, p in zip(grads, (*norm.parameters(), *proj.parameters()), strict=True):
        torch.testing.assert_close(a, p.grad)


def test_configs_resolve_from_a_table_like_a_built_in_kernels(tmp_path, monkeypatch):
    """An entry at the call's key is used (explain says so) and computes the same norm."""
    m, n = 6, 64
    configs = {spec.name: next(c for c in spec.configs(spec.problem(8, n, "float32"))
                               if c != spec.default(spec.problem(8, n, "float32")))
               for spec in (FWD, BWD)}
    path = tmp_path / "table.json"
    path.write_text(dumps(Table(GPU, entries=[
        Entry(kernel=name, dtype="float32", n=n, m=8, config=c.to_json(), us=1.0, gbps=1.0,
              default_us=2.0, trials=3, kernel_hash=REGISTRY_HASH[name])
        for name, c in configs.items()])))
    monkeypatch.setenv("KERNELTUNE_TABLE", str(path))
    kerneltune.runtime.reset()
    x = rand(m, n, mean=1.0).requires_grad_()
    for name, config in configs.items():
        found = kerneltune.explain(name, (m, n, "float32"))
        assert found.match == "exact" and found.config == config
    w = rand(n, seed=1).requires_grad_()
    y = kerneltune.layer_norm(x, w)
    assert off_by(y, x.detach(), w.detach(), None) is None
    y.sum().backward()
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    F.layer_norm(x64, (n,), w64, None, 1e-5).sum().backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad.double(), w64.grad, rtol=1e-5, atol=1e-5)


REGISTRY_HASH = {spec.name: spec.kernel_hash for spec in (FWD, BWD)}


# ---------------------------------------------------------------------------- errors


def bad_calls():
    x, w = rand(4, 32), rand(32)
    return [
        ("weight size", ValueError, r"weight has shape \(31,\), expected \(32,\)",
         lambda: kerneltune.layer_norm(x, rand(31))),
        ("bias size", ValueError, r"bias has shape \(1, 32\)",
         lambda: kerneltune.layer_norm(x, w, rand(1, 32))),
        ("weight device", ValueError, f"weight is on meta but the input is on {DEVICE}",
         lambda: kerneltune.layer_norm(x, w.to("meta"))),
        ("x dtype", TypeError, "x has dtype torch.int32",
         lambda: kerneltune.layer_norm(x.int())),
        ("bias dtype", TypeError, "bias has dtype torch.int64",
         lambda: kerneltune.layer_norm(x, w, torch.ones(32, dtype=torch.long, device=DEVICE))),
        ("not a tensor", TypeError, "x must be a torch.Tensor",
         lambda: kerneltune.layer_norm([1.0, 2.0])),
        ("N = 0", ValueError, "hidden size 0", lambda: kerneltune.layer_norm(rand(4, 0))),
        ("scalar", ValueError, "at least one dimension",
         lambda: kerneltune.layer_norm(rand(4)[0])),
        ("eps nan", ValueError, "eps must be a finite number",
         lambda: kerneltune.layer_norm(x, eps=float("nan"))),
        ("eps inf", ValueError, "eps must be a finite number",
         lambda: kerneltune.layer_norm(x, eps=float("inf"))),
        ("eps negative", ValueError, "eps must be >= 0",
         lambda: kerneltune.layer_norm(x, eps=-1.0)),
        ("module eps", ValueError, "eps must be a finite number",
         lambda: kerneltune.LayerNorm(32, eps=float("nan"))),
    ]


@pytest.mark.parametrize("case", bad_calls(), ids=lambda c: c[0])
def test_bad_input_is_a_clear_error(case):
    _, error, message, call = case
    with pytest.raises(error, match=message):
        call()


def test_a_cpu_tensor_off_the_interpreter_computes_the_torch_formula(monkeypatch):
    """Where Triton compiles for a GPU, a CPU tensor never reaches a launch: its call computes
    the torch formula in fp32, with one warning, and its bad input the same errors."""
    if DEVICE != "cpu":
        pytest.skip("compares with the kernels under the interpreter")
    x, w, b = rand(4, 32, dtype=torch.bfloat16, mean=1.0), rand(32, seed=1), rand(32, seed=2)
    expected = kerneltune.layer_norm(x, w, b)
    monkeypatch.setattr(_spec, "interpreting", lambda: False)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got, again = kerneltune.layer_norm(x, w, b), kerneltune.layer_norm(x, w, b)
    assert got.dtype == torch.bfloat16 and off_by(got, x, w, b) is None
    torch.testing.assert_close(got, expected, rtol=0, atol=2**-7 * expected.abs().max().item())
    torch.testing.assert_close(again, got, rtol=0, atol=0)
    assert len(kt_warnings(record)) == 1 and "computing the torch formula" in kt_warnings(
        record)[0]
    with pytest.raises(ValueError, match="eps must be a finite number"):
        kerneltune.layer_norm(x, eps=float("nan"))
