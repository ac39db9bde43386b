"""Where the kernels cannot run (here: CPU tensors without TRITON_INTERPRET), the public
functions and modules compute the torch formula with one warning, in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("transformers")

#: Run without the interpreter: every call below takes the torch formula.
SCRIPT = textwrap.dedent("""
    import warnings
    import torch
    import kerneltune
    from kerneltune.kernels._spec import compare_outputs
    from kerneltune.kernels.add_rmsnorm_spec import add_rmsnorm_fwd_ref
    from kerneltune.kernels.rmsnorm_fwd_spec import rmsnorm_fwd_ref
    from kerneltune.kernels.rmsnorm_quant_spec import check_quantised
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaConfig, LlamaForCausalLM, LlamaRMSNorm

    warnings.simplefilter("always")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 48, generator=g)
    w = 1 + 0.3 * torch.randn(48, generator=g)
    res = torch.randn(2, 3, 48, generator=g)
    with warnings.catch_warnings(record=True) as record:
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            xd, wd, rd = x.to(dtype), w.to(dtype), res.to(dtype)
            rows = xd.reshape(-1, 48)
            for offset in (0.0, 1.0):
                y = kerneltune.rms_norm(xd, wd, 1e-5, offset)
                ref = rmsnorm_fwd_ref(rows, wd, 1e-5, offset)[0].reshape(x.shape)
                assert y.dtype == dtype and compare_outputs([y], [ref]) is None, (dtype, offset)
                y, s = kerneltune.add_rms_norm(xd, rd, wd, 1e-5, offset)
                ref_y, ref_s, _ = add_rmsnorm_fwd_ref(rows, rd.reshape(-1, 48), wd, 1e-5, offset)
                assert compare_outputs([y.reshape(-1, 48), s.reshape(-1, 48)],
                                       [ref_y, ref_s]) is None, (dtype, offset)
            for quant in ("int8", "fp8"):
                q, scale = kerneltune.rms_norm_quant(xd, wd, 1e-6, quant)
                inputs = {"x": rows, "weight": wd, "bias": None, "eps": 1e-6, "quant": quant}
                assert check_quantised(inputs, (q.reshape(-1, 48), scale.reshape(-1))) is None
            z = kerneltune.rms_norm_fake_quant(xd, wd, rd[0, 0], 1e-5)
            assert z.dtype == dtype and z.shape == x.shape

        # bit for bit HF's modules in half precision
        for hf in (LlamaRMSNorm(48, eps=1e-6), GemmaRMSNorm(48, eps=1e-6)):
            with torch.no_grad():
                hf.weight.normal_(0.0, 0.5)
            hf = hf.half()
            ours = kerneltune.RMSNorm.from_hf(hf)
            with torch.no_grad():
                assert torch.equal(ours(x.half()), hf(x.half())), type(hf).__name__

        # gradients, through autograd of the formula
        x64 = x.double().requires_grad_()
        w64 = w.double().requires_grad_()
        (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * w64).sum().backward()
        xf, wf = x.clone().requires_grad_(), w.clone().requires_grad_()
        kerneltune.rms_norm(xf, wf).sum().backward()
        torch.testing.assert_close(xf.grad.double(), x64.grad, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(wf.grad.double(), w64.grad, rtol=1e-4, atol=1e-5)

        # a whole model, patched
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, vocab_size=64)).eval()
        ids = torch.arange(10).reshape(2, 5)
        with torch.no_grad():
            expected = model(ids).logits
            assert len(kerneltune.patch_model(model)) == 3
            torch.testing.assert_close(model(ids).logits, expected, rtol=1e-5, atol=1e-5)

        # bad input is still refused, by the same checks
        for call, error in ((lambda: kerneltune.rms_norm(x, w[:3]), ValueError),
                            (lambda: kerneltune.rms_norm(x.int(), w), TypeError),
                            (lambda: kerneltune.rms_norm(x, w, eps=float("nan")), ValueError),
                            (lambda: kerneltune.add_rms_norm(x, res.half(), w), TypeError),
                            (lambda: kerneltune.rms_norm_quant(x, w, quant="int4"), ValueError)):
            try:
                call()
            except error:
                pass
            else:
                raise AssertionError("accepted bad input")

    messages = [str(r.message) for r in record
                if issubclass(r.category, kerneltune.runtime.KerneltuneWarning)]
    assert len(messages) == 1, messages
    assert "do not run on cpu tensors" in messages[0] and "torch formula" in messages[0]
    print("ok")
""")


def test_cpu_without_the_interpreter_computes_the_torch_formula():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "ok"
