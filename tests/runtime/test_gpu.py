"""On a GPU: the fast launch path is taken, gives the launchers' results, and works under CUDA
graphs. Skipped without one (the interpreter has no compiled kernels to launch)."""

from __future__ import annotations

import pytest
import torch

import kerneltune
from kerneltune.kernels import rmsnorm_quant
from kerneltune.kernels._spec import compare_outputs
from kerneltune.kernels.add_rmsnorm import add_rmsnorm_fwd_ref
from kerneltune.kernels.rmsnorm_fwd import rmsnorm_fwd_ref
from kerneltune.runtime import bench, launch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or launch.interpreting(), reason="needs a GPU"
)


def test_fast_path_is_available_for_this_triton():
    assert launch._fast_driver() is not None


@pytest.mark.parametrize("m,n", [(1, 4096), (64, 4096), (37, 5120), (300, 1000)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fast_path_results(m, n, dtype):
    x = torch.randn(m, n + 64, device="cuda", dtype=dtype)[:, 32:32 + n]
    w = torch.randn(n, device="cuda", dtype=dtype)
    res = torch.randn(m, n, device="cuda", dtype=dtype)
    with torch.inference_mode():
        for _ in range(3):  # first call checks the plan, later ones launch directly
            y = kerneltune.rms_norm(x, w)
            y1 = kerneltune.rms_norm(x, w, offset=1.0)
            ya, s = kerneltune.add_rms_norm(x, res, w)
            q, scale = kerneltune.rms_norm_quant(x, w)
    assert launch.RMSNORM_FWD_INFERENCE.enabled and launch.RMSNORM_FWD_INFERENCE.compiled
    assert launch.ADD_RMSNORM_FWD.enabled and launch.ADD_RMSNORM_FWD.compiled
    assert launch.RMSNORM_QUANT_FWD.enabled and launch.RMSNORM_QUANT_FWD.compiled
    assert compare_outputs([y], [rmsnorm_fwd_ref(x, w, 1e-6)[0]]) is None
    assert compare_outputs([y1], [rmsnorm_fwd_ref(x, w, 1e-6, 1.0)[0]]) is None
    y_ref, s_ref, _ = add_rmsnorm_fwd_ref(x, res, w, 1e-6)
    assert compare_outputs([ya, s], [y_ref, s_ref]) is None
    inputs = {"x": x, "weight": w, "bias": None, "eps": 1e-6, "quant": "int8"}
    assert rmsnorm_quant.SPEC.check(inputs, (q, scale.reshape(-1))) is None


def test_cuda_graph_capture_and_replay():
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        kerneltune.rms_norm(x, w)  # resolve, compile, check the plan before capture
        kerneltune.rms_norm(x, w)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = kerneltune.rms_norm(x, w)
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
    assert compare_outputs([y], [rmsnorm_fwd_ref(x, w, 1e-6)[0]]) is None


def test_host_overhead_is_measurable():
    result = bench.rms_norm_host_overhead(64, 4096, calls=200, repeats=2)
    assert result["kerneltune_us"] > 0 and result["torch_rms_norm_us"] > 0


@pytest.mark.skipif(not hasattr(torch._C, "_StaticCudaLauncher"),
                    reason="this torch has no static launcher for Triton kernels")
def test_fast_path_launches_through_torchs_static_launcher():
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    launch.reset()
    with torch.inference_mode():
        for m in (1, 64):  # M == 1 is specialised away from the cubin's parameters
            for _ in range(2):
                y = kerneltune.rms_norm(x[:m], w)
            assert compare_outputs([y], [rmsnorm_fwd_ref(x[:m], w, 1e-6)[0]]) is None
    launchers = list(launch.RMSNORM_FWD_INFERENCE.compiled.values())
    assert len(launchers) == 2
    assert all(f.__qualname__.startswith("static_launcher") for f in launchers)
