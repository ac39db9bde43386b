"""`rms_norm_group_quant` and `add_rms_norm_quant` against the float64 reference: shapes,
strides and layouts of their outputs, per-token scales equal to `rms_norm_quant`'s, the config
resolved from a table, torch.compile, the torch formula off the kernels, and bad input getting
a clear error: on the GPU where there is one, else under the interpreter."""

from __future__ import annotations

import warnings

import pytest
import torch

import kerneltune
from kerneltune.kernels import _spec
from kerneltune.kernels.rmsnorm_group_quant_spec import ADD_FWD, FWD, check_group_quantised
from kerneltune.runtime.group_quant import rms_norm_group_quant_op
from kerneltune.table import Entry, Table, dumps

from .conftest import DEVICE, GPU, kt_warnings


def rand(*shape, dtype=torch.bfloat16, seed=0, std=1.0):
    g = torch.Generator().manual_seed(seed)
    return (std * torch.randn(*shape, generator=g, dtype=torch.float64)).to(DEVICE, dtype)


def off_by(out, x, w, residual=None, quant="fp8", group=128, ue8m0=False, column_major=False,
           eps=1e-6) -> str | None:
    """Why the outputs are not the kernel's for these inputs (None if they are)."""
    n = x.shape[-1]
    groups = 1 if group is None else n // group
    q, scales = out[0].reshape(-1, n), out[1].reshape(-1, groups)
    inputs = {"x": x.reshape(-1, n), "weight": w, "eps": eps, "quant": quant,
              "group_size": group, "scale_ue8m0": ue8m0, "column_major_scales": column_major}
    if residual is not None:
        inputs["residual"] = residual.reshape(-1, n)
    return check_group_quantised(inputs, (q, scales, *(o.reshape(-1, n) for o in out[2:])))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("quant", ["fp8", "int8"])
@pytest.mark.parametrize("shape", [(2, 3, 256), (5, 128), (256,)])
def test_rms_norm_group_quant(dtype, quant, shape):
    x, w = rand(*shape, dtype=dtype), rand(shape[-1], dtype=dtype, seed=1) + 1
    q, scales = kerneltune.rms_norm_group_quant(x, w, quant=quant)
    assert q.shape == x.shape and q.dtype == {"fp8": torch.float8_e4m3fn, "int8": torch.int8}[quant]
    assert scales.shape == (*shape[:-1], shape[-1] // 128) and scales.dtype == torch.float32
    assert off_by((q, scales), x, w, quant=quant) is None


@pytest.mark.parametrize("group", [32, 64, 256])
def test_group_sizes_ue8m0_and_column_major_scales(group):
    x, w = rand(3, 5, 512), rand(512, seed=1) + 1
    q, scales = kerneltune.rms_norm_group_quant(x, w, group_size=group, scale_ue8m0=True,
                                                column_major_scales=True)
    assert scales.shape == (3, 5, 512 // group)
    assert scales.reshape(15, -1).stride() == (1, 15)  # column-major over the 15 rows
    assert (torch.frexp(scales)[0] == 0.5).all()
    assert off_by((q, scales), x, w, group=group, ue8m0=True, column_major=True) is None
    q_rows, s_rows = kerneltune.rms_norm_group_quant(x, w, group_size=group, scale_ue8m0=True)
    assert s_rows.is_contiguous() and torch.equal(scales, s_rows)
    assert torch.equal(q.view(torch.uint8), q_rows.view(torch.uint8))


def test_strided_rows():
    wide, w = rand(6, 700), rand(512, seed=1) + 1
    x = wide[:, 100:612]
    q, scales = kerneltune.rms_norm_group_quant(x, w, quant="int8")
    assert off_by((q, scales), x, w, quant="int8") is None
    q2, s2 = kerneltune.rms_norm_group_quant(x.contiguous(), w, quant="int8")
    assert torch.equal(q, q2) and torch.equal(scales, s2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("quant", ["int8", "fp8"])
def test_add_rms_norm_quant_per_token_is_rms_norm_quant_of_the_sum(dtype, quant):
    x, residual = rand(2, 7, 96, dtype=dtype), rand(2, 7, 96, dtype=dtype, seed=2, std=2.0)
    w = rand(96, dtype=dtype, seed=1) + 1
    q, scale, s = kerneltune.add_rms_norm_quant(x, residual, w, quant=quant)
    assert torch.equal(s, (x.float() + residual.float()).to(dtype))
    assert scale.shape == (2, 7, 1)
    q_ref, scale_ref = kerneltune.rms_norm_quant(s, w, quant=quant)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(scale, scale_ref)
    assert off_by((q, scale, s), x, w, residual, quant=quant, group=None) is None


def test_one_group_a_row_is_rms_norm_quant():
    x, w = rand(3, 100), rand(100, seed=1) + 1
    for quant in ("int8", "fp8"):
        q, scales = kerneltune.rms_norm_group_quant(x, w, quant=quant, group_size=None)
        q_ref, s_ref = kerneltune.rms_norm_quant(x, w, quant=quant)
        assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
        assert scales.shape == (3, 1) and torch.equal(scales, s_ref)


def test_add_rms_norm_quant_per_group():
    x, residual, w = rand(5, 384), rand(5, 384, seed=2, std=2.0), rand(384, seed=1) + 1
    q, scales, s = kerneltune.add_rms_norm_quant(x, residual, w, group_size=128,
                                                 column_major_scales=True)
    assert scales.shape == (5, 3) and scales.stride() == (1, 5)
    assert off_by((q, scales, s), x, w, residual, column_major=True) is None
    q2, s2 = kerneltune.rms_norm_group_quant(s, w, group_size=128, column_major_scales=True)
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(scales, s2)


def test_configs_resolve_from_a_table(tmp_path, monkeypatch):
    """An entry at the call's key is used (explain says so) and computes the same output."""
    m, n = 6, 256
    configs = {spec.name: next(c for c in spec.configs(spec.problem(8, n, "bfloat16"))
                               if c != spec.default(spec.problem(8, n, "bfloat16")))
               for spec in (FWD, ADD_FWD)}
    path = tmp_path / "table.json"
    path.write_text(dumps(Table(GPU, entries=[
        Entry(kernel=spec.name, dtype="bfloat16", n=n, m=8, config=configs[spec.name].to_json(),
              us=1.0, gbps=1.0, default_us=2.0, trials=3, kernel_hash=spec.kernel_hash)
        for spec in (FWD, ADD_FWD)])))
    monkeypatch.setenv("KERNELTUNE_TABLE", str(path))
    kerneltune.runtime.reset()
    for name, config in configs.items():
        found = kerneltune.explain(name, (m, n, "bfloat16"))
        assert found.match == "exact" and found.config == config
    x, residual, w = rand(m, n), rand(m, n, seed=2), rand(n, seed=1) + 1
    assert off_by(kerneltune.rms_norm_group_quant(x, w), x, w) is None
    out = kerneltune.add_rms_norm_quant(x, residual, w, group_size=64)
    assert off_by(out, x, w, residual, group=64) is None


def test_custom_op_passes_opcheck():
    x, residual, w = rand(3, 256), rand(3, 256, seed=2), rand(256, seed=1) + 1
    torch.library.opcheck(rms_norm_group_quant_op, (x, None, w, 1e-6, "fp8", 128, False, True))
    torch.library.opcheck(rms_norm_group_quant_op, (x, residual, w, 1e-6, "int8", 0, True, False))


def test_torch_compile_fullgraph():
    torch._dynamo.reset()
    x, residual, w = rand(2, 3, 256), rand(2, 3, 256, seed=2), rand(256, seed=1) + 1

    def block(x, residual):
        q, scales = kerneltune.rms_norm_group_quant(x, w, column_major_scales=True)
        q2, scale, s = kerneltune.add_rms_norm_quant(x, residual, w, quant="int8")
        return q.float() * scales.repeat_interleave(128, -1), q2.float() * scale, s

    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    for a, b in zip(compiled(x, residual), block(x, residual), strict=True):
        assert torch.equal(a, b)


def test_a_cpu_tensor_off_the_interpreter_computes_the_torch_formula(monkeypatch):
    """Off the kernels, the same calls compute the formula in fp32 (one warning), with the
    same shapes and layouts, and refuse the same bad input."""
    if DEVICE != "cpu":
        pytest.skip("compares with the kernels under the interpreter")
    x, residual, w = rand(2, 3, 256), rand(2, 3, 256, seed=2), rand(256, seed=1) + 1
    expected = (kerneltune.rms_norm_group_quant(x, w, quant="int8", column_major_scales=True),
                kerneltune.add_rms_norm_quant(x, residual, w, group_size=64, scale_ue8m0=True))
    monkeypatch.setattr(_spec, "interpreting", lambda: False)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got = (kerneltune.rms_norm_group_quant(x, w, quant="int8", column_major_scales=True),
               kerneltune.add_rms_norm_quant(x, residual, w, group_size=64, scale_ue8m0=True))
    assert len(kt_warnings(record)) == 1 and "computing the torch formula" in kt_warnings(
        record)[0]
    assert off_by(got[0], x, w, quant="int8", column_major=True) is None
    assert off_by(got[1], x, w, residual, group=64, ue8m0=True) is None
    for a, b in zip((*got[0], *got[1]), (*expected[0], *expected[1]), strict=True):
        assert a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
    with pytest.raises(ValueError, match="not a multiple of group_size=128"):
        kerneltune.rms_norm_group_quant(rand(2, 96), rand(96))


def bad_calls():
    x, w, residual = rand(4, 256), rand(256), rand(4, 256)
    gq, arq = kerneltune.rms_norm_group_quant, kerneltune.add_rms_norm_quant
    return [
        ("N not a multiple", ValueError, "hidden size 96 is not a multiple of group_size=128",
         lambda: gq(rand(4, 96), rand(96))),
        ("group size", ValueError, "group_size must be one of",
         lambda: gq(x, w, group_size=100)),
        ("group size bool", ValueError, "group_size must be one of",
         lambda: gq(x, w, group_size=True)),
        ("quant", ValueError, "unknown quant mode 'fake'", lambda: gq(x, w, quant="fake")),
        ("flag", TypeError, "scale_ue8m0 must be a bool", lambda: gq(x, w, scale_ue8m0=1)),
        ("weight size", ValueError, r"weight has shape \(255,\)", lambda: gq(x, rand(255))),
        ("x dtype", TypeError, "x has dtype torch.int32", lambda: gq(x.int(), w)),
        ("not a tensor", TypeError, "x must be a torch.Tensor", lambda: gq([1.0], w)),
        ("N = 0", ValueError, "hidden size 0", lambda: gq(rand(4, 0), rand(0))),
        ("eps", ValueError, "eps must be a finite number", lambda: gq(x, w, eps=float("nan"))),
        ("residual shape", ValueError, r"residual has shape \(4, 128\)",
         lambda: arq(x, rand(4, 128), w)),
        ("residual dtype", TypeError, "residual has dtype torch.float32",
         lambda: arq(x, residual.float(), w)),
        ("residual none", TypeError, "residual must be a torch.Tensor",
         lambda: arq(x, None, w)),
        ("residual group", ValueError, "not a multiple of group_size=256",
         lambda: arq(rand(4, 384), rand(4, 384), rand(384), group_size=256)),
    ]


@pytest.mark.parametrize("case", bad_calls(), ids=lambda c: c[0])
def test_bad_input_is_a_clear_error(case):
    _, error, message, call = case
    with pytest.raises(error, match=message):
        call()


def test_public_names():
    for name in ("add_rms_norm_quant", "rms_norm_group_quant"):
        assert name in kerneltune.__all__ and name in dir(kerneltune)
        assert getattr(kerneltune, name) is getattr(kerneltune.runtime, name)


def test_rms_norm_quant_takes_a_group_size_and_names_the_kernel_in_explain():
    """`rms_norm_quant(..., group_size=...)` is the grouped call; `explain` takes both public
    names of the grouped kernels."""
    x, w = rand(3, 256), rand(256, seed=1) + 1
    grouped = kerneltune.rms_norm_quant(x, w, quant="fp8", group_size=64, scale_ue8m0=True)
    alone = kerneltune.rms_norm_group_quant(x, w, quant="fp8", group_size=64, scale_ue8m0=True)
    assert grouped[1].shape == (3, 4) and torch.equal(grouped[1], alone[1])
    assert torch.equal(grouped[0].view(torch.uint8), alone[0].view(torch.uint8))
    assert kerneltune.rms_norm_quant(x, w, quant="fp8")[1].shape == (3, 1)  # per token
    for name, kernel in (("rms_norm_group_quant", FWD.name), ("add_rms_norm_quant", ADD_FWD.name)):
        assert kerneltune.explain(name, x).kernel == kernel
