"""On a GPU: the fast launch path is taken, gives the launchers' results, and works under CUDA
graphs. Skipped without one (the interpreter has no compiled kernels to launch)."""

from __future__ import annotations

import pytest
import torch

import kerneltune
from kerneltune.kernels import BackwardConfig, rmsnorm_quant_spec
from kerneltune.kernels._spec import compare_outputs, interpreting
from kerneltune.kernels.add_rmsnorm_spec import add_rmsnorm_fwd_ref
from kerneltune.kernels.rmsnorm_fwd_spec import rmsnorm_fwd_ref
from kerneltune.runtime import _launchers, bench, launch, layer_norm, ops, replay

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or interpreting(), reason="needs a GPU"
)


#: torch's C++ launcher for Triton cubins, which the fast paths launch through where it exists.
needs_static_launcher = pytest.mark.skipif(not hasattr(torch._C, "_StaticCudaLauncher"),
                                           reason="this torch has no static launcher for Triton "
                                           "kernels")


def _is_bound(site: str, *args) -> bool:
    """Whether calls from `site` with `args` are bound to their launch."""
    return launch.call_key(site, args) in launch._bound


def test_fast_path_is_available_for_this_triton():
    assert _launchers.fast_driver() is not None


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
    assert rmsnorm_quant_spec.SPEC.check(inputs, (q, scale.reshape(-1))) is None


@pytest.mark.parametrize("kernel", ["rmsnorm_fwd", "add_rmsnorm_fwd", "rmsnorm_quant_fwd"])
def test_row_splits_stay_right_call_after_call(kernel):
    """A row split of one phase takes the fast path; its partial slots are made anew by each
    call (a slot kept from the call before would hand its partials to the next)."""
    spec = kerneltune.kernels.REGISTRY[kernel]
    problem = spec.problem(16, 65536, "bfloat16", **({"quant": "int8"} if "quant" in kernel
                                                      else {}))
    split = next(c for c in spec.candidates(problem) if c.COOP)
    k = {"rmsnorm_fwd": launch.RMSNORM_FWD, "add_rmsnorm_fwd": launch.ADD_RMSNORM_FWD,
         "rmsnorm_quant_fwd": launch.RMSNORM_QUANT_FWD}[kernel]
    names = {"rmsnorm_fwd": ("x", "weight", "eps", "offset"),
             "add_rmsnorm_fwd": ("x", "residual", "weight", "eps", "offset"),
             "rmsnorm_quant_fwd": ("x", "weight", "bias", "eps", "quant")}[kernel]
    launch.reset()
    for seed in range(4):
        inputs = spec.make_inputs(problem, seed, "cuda")
        args = tuple(inputs[a] for a in names)
        out = launch.launch(k, split, id(split), *args)
        assert spec.check(inputs, out) is None, seed
    if len(k.describe(*args, split).launches) == 1:
        assert k.compiled  # compiled once, then launched directly
    with torch.inference_mode():  # the public function's bound path binds no split
        for seed in range(4):
            inputs = spec.make_inputs(problem, seed + 10, "cuda")
            if kernel == "rmsnorm_fwd":
                got = (kerneltune.rms_norm(inputs["x"], inputs["weight"]),)
                want = (rmsnorm_fwd_ref(inputs["x"], inputs["weight"], 1e-6)[0],)
                assert compare_outputs(got, want) is None, seed


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
    # Eager calls were compiled without a dependent launch; the captured one with it on sm_90+.
    assert ({key[-1] for key in launch.RMSNORM_FWD_INFERENCE.compiled}
            == {False, launch.dependent_launch(x.device)})


def test_host_overhead_is_measurable():
    result = bench.rms_norm_host_overhead(64, 4096, calls=200, repeats=2)
    assert result["kerneltune_us"] > 0 and result["torch_rms_norm_us"] > 0


@needs_static_launcher
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


@needs_static_launcher
def test_every_bound_function_launches_through_torchs_static_launcher():
    """Triton's own launcher runs microseconds of Python around its C call: every public
    function whose calls are bound must reach torch's C++ launcher instead."""
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    r, w, b = torch.randn_like(x), torch.randn_like(x[0]), torch.randn_like(x[0])
    calls = {
        "rmsnorm_fwd_inference": lambda: kerneltune.rms_norm(x, w),
        "add_rmsnorm_fwd": lambda: kerneltune.add_rms_norm(x, r, w),
        "rmsnorm_quant_fwd": lambda: (kerneltune.rms_norm_quant(x, w, quant="int8"),
                                      kerneltune.rms_norm_quant(x, w, quant="fp8")),
        "layernorm_fwd": lambda: kerneltune.layer_norm(x, w, b),
        "rmsnorm_group_quant_fwd": lambda: (
            kerneltune.rms_norm_group_quant(x, w, quant="fp8", group_size=128),
            kerneltune.add_rms_norm_quant(x, r, w, quant="fp8", group_size=128)),
    }
    launch.reset()
    replay.reset()
    with torch.inference_mode():
        for _ in range(2):  # launched, then bound
            for call in calls.values():
                call()
    for name in calls:
        k = next(k for k in launch._kernels if k.name == name)
        launchers = list(k.compiled.values())
        if k.replayed is not None:  # a tuned row split's calls are replayed
            (replayed,) = k.replayed.args
            launchers += [s.launch for rec in replayed.recordings.values() if rec
                          for s in rec.steps]
        assert launchers, name
        assert all(f.__qualname__.startswith("static_launcher") for f in launchers), name


@needs_static_launcher
def test_every_replayed_backward_launches_through_torchs_static_launcher():
    """As the bound forwards: each launch of a replayed backward (the main kernel and its dw
    reduction) reaches torch's C++ launcher."""
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn_like(w, requires_grad=True)
    dy = torch.randn_like(x)
    replay.reset()
    for _ in range(2):
        kerneltune.rms_norm(x, w).backward(dy)
        kerneltune.layer_norm(x, w, b).backward(dy)
    for r in (replay.RMSNORM_BWD, layer_norm.LAYERNORM_BWD):
        steps = [s for rec in r.recordings.values() if rec for s in rec.steps]
        assert steps, r.name
        assert all(s.launch.__qualname__.startswith("static_launcher") for s in steps), r.name


def test_bound_calls_are_kept_apart_by_everything_their_launch_depends_on():
    """Each call is bound to its own launch after its first call; later calls give the
    reference's result; a weight that must be copied each call is never bound."""
    launch.reset()
    base = torch.randn(64, 4096 + 64, device="cuda", dtype=torch.bfloat16)
    x = base[:, :4096].contiguous()
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    w_strided = torch.randn(8192, device="cuda", dtype=torch.bfloat16)[::2]
    cases = [
        (x, w, 1e-6, 0.0),
        (x[:1], w, 1e-6, 0.0),  # M == 1 is specialised away from the cubin's parameters
        (base[:, 32:32 + 4096], w, 1e-6, 0.0),  # strided rows
        (base[:, 1:1 + 4096], w, 1e-6, 0.0),  # rows not 16-byte aligned
        (x.view(8, 8, 4096), w, 1e-6, 0.0),
        (x, w, 1e-5, 0.0),
        (x, w, 1e-6, 1.0),
        (x.half(), w.half(), 1e-6, 0.0),
        (x, w_strided, 1e-6, 0.0),
    ]
    with torch.inference_mode():
        for _ in range(3):
            outputs = [kerneltune.rms_norm(*case) for case in cases]
        site = ops._RMS_NORM_INFERENCE
        assert all(_is_bound(site, *case) for case in cases[:-1])
        assert not _is_bound(site, *cases[-1])
    for (xi, wi, eps, offset), y in zip(cases, outputs, strict=True):
        assert y.shape == xi.shape and y.is_contiguous()
        assert compare_outputs([y], [rmsnorm_fwd_ref(xi, wi, eps, offset)[0]]) is None


def test_bound_fused_calls_give_the_launchers_results_bit_for_bit(monkeypatch):
    """`add_rms_norm`, `rms_norm_quant`, `rms_norm_fake_quant`, `layer_norm`,
    `rms_norm_group_quant` and `add_rms_norm_quant` are bound after their first call; the bound
    launches, given new values in the same layout, give what the modules' launchers give bit
    for bit. A call with one tensor as both x and residual binds nothing
    (the plan tells its arguments apart by identity), but is served by the binding of another
    call with its key; its 3-d views bind, and serve another residual of the same layout."""
    launch.reset()
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)

    base, x, r = randn(64, 4096 + 64), randn(64, 4096), randn(64, 4096)
    w, b, w_strided = randn(4096), randn(4096), randn(8192)[::2]
    x3, r3 = x.view(8, 8, 4096), r.view(8, 8, 4096)
    add, quant, fake = ops._ADD_RMS_NORM_INFERENCE, ops._QUANT, ops._QUANT_Q
    ln, group, add_quant = "layer_norm inference", "rms_norm_group_quant", "add_rms_norm_quant"
    # (function, arguments, its call site and key arguments)
    cases = [
        (kerneltune.add_rms_norm, (x, r, w), (add, x, r, w, 1e-6, 0.0)),
        (kerneltune.add_rms_norm, (x, r, w, 1e-5, 1.0), (add, x, r, w, 1e-5, 1.0)),
        (kerneltune.add_rms_norm, (base[:, 32:32 + 4096], r, w),
         (add, base[:, 32:32 + 4096], r, w, 1e-6, 0.0)),
        (kerneltune.add_rms_norm, (x[:1], r[:1], w), (add, x[:1], r[:1], w, 1e-6, 0.0)),
        (kerneltune.add_rms_norm, (x3, x3, w), (add, x3, x3, w, 1e-6, 0.0)),
        (kerneltune.add_rms_norm, (x3, r3, w), (add, x3, r3, w, 1e-6, 0.0)),
        (kerneltune.add_rms_norm, (x, x, w), (add, x, x, w, 1e-6, 0.0)),
        (kerneltune.rms_norm_quant, (x, w), (quant, x, w, None, 1e-6, "int8")),
        (kerneltune.rms_norm_quant, (x, w, 1e-6, "fp8"), (quant, x, w, None, 1e-6, "fp8")),
        (kerneltune.rms_norm_quant, (x3, w), (quant, x3, w, None, 1e-6, "int8")),
        (kerneltune.rms_norm_quant, (x[:1], w), (quant, x[:1], w, None, 1e-6, "int8")),
        (kerneltune.rms_norm_quant, (x, w_strided), (quant, x, w_strided, None, 1e-6, "int8")),
        (kerneltune.rms_norm_fake_quant, (x,), (fake, x, None, None, 1e-5, "fake")),
        (kerneltune.rms_norm_fake_quant, (x, w, b), (fake, x, w, b, 1e-5, "fake")),
        (kerneltune.rms_norm_fake_quant, (x3, None, b), (fake, x3, None, b, 1e-5, "fake")),
        (kerneltune.layer_norm, (x, w, b), (ln, x, w, b, 1e-5)),
        (kerneltune.layer_norm, (x3, None, b, 1e-6), (ln, x3, None, b, 1e-6)),
        (kerneltune.layer_norm, (x[:1], w), (ln, x[:1], w, None, 1e-5)),
        (kerneltune.rms_norm_group_quant, (x, w), (group, x, None, w, 1e-6, "fp8", 128, False,
                                                   False)),
        (kerneltune.rms_norm_group_quant, (x3, w, 1e-6, "int8", 64, True),
         (group, x3, None, w, 1e-6, "int8", 64, True, False)),
        (kerneltune.add_rms_norm_quant, (x, r, w, 1e-6, "fp8", 128),
         (add_quant, x, r, w, 1e-6, "fp8", 128, False, False)),
        (kerneltune.add_rms_norm_quant, (x3, r3, w), (add_quant, x3, r3, w, 1e-6, "fp8", None,
                                                      False, False)),
    ]
    with torch.inference_mode():
        for _ in range(2):
            kerneltune.add_rms_norm(x, x, w)
        assert not _is_bound(add, x, x, w, 1e-6, 0.0)
        for _ in range(2):
            for fn, args, _ in cases:
                fn(*args)
        unbound = [i for i, (_, _, key) in enumerate(cases) if not _is_bound(*key)]
        assert unbound == [11]  # the strided weight; (x, x, w) has (x, r, w)'s key
        for t in (base, x, r, w, b, w_strided):  # new values, same layout: same keys
            t.copy_(randn(*t.shape))
        got = [fn(*args) for fn, args, _ in cases]
        monkeypatch.setenv(_launchers.ENV_FAST_LAUNCH, "0")
        launch.reset()
        expected = [fn(*args) for fn, args, _ in cases]
    assert not launch._bound
    for (fn, _, _), a, e in zip(cases, got, expected, strict=True):
        a, e = (a, e) if isinstance(a, tuple) else ((a,), (e,))
        assert all(u.shape == v.shape and u.dtype == v.dtype and u.is_contiguous()
                   and torch.equal(u.float(), v.float()) for u, v in zip(a, e, strict=True)), fn


def test_a_launch_hook_turns_bound_calls_off():
    """A profiler's launch hook sees every launch: with one installed, calls go through
    Triton's own launch."""
    from triton import knobs

    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    seen = []

    def hook(metadata):
        seen.append(metadata)

    with torch.inference_mode():
        kerneltune.rms_norm(x, w)
        kerneltune.rms_norm(x, w)
        assert _is_bound(ops._RMS_NORM_INFERENCE, x, w, 1e-6, 0.0)
        knobs.runtime.launch_enter_hook.add(hook)
        try:
            assert launch.run_bound(ops._RMS_NORM_INFERENCE, x, w, 1e-6, 0.0) is None
            y = kerneltune.rms_norm(x, w)
        finally:
            knobs.runtime.launch_enter_hook.remove(hook)
    assert seen
    assert compare_outputs([y], [rmsnorm_fwd_ref(x, w, 1e-6)[0]]) is None


def _bwd_configs_by_mode(m: int, n: int) -> dict[str, BackwardConfig]:
    """The first valid config of each dw strategy at (m, n): one of every launch sequence."""
    from kerneltune.kernels.rmsnorm_bwd_spec import SPEC

    problem, found = SPEC.problem(m, n, "bfloat16"), {}
    for config in (*SPEC.candidates(problem), SPEC.default(problem), *SPEC.configs(problem)):
        found.setdefault(config.DW, config)
    return found


def _bwd_inputs(m: int, n: int, seed: int, row_stride: int) -> tuple:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x, dy = (torch.randn(m, row_stride, device="cuda", dtype=torch.bfloat16, generator=g)[:, :n]
             for _ in range(2))
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=g)
    return dy, x, w, torch.rsqrt(x.float().pow(2).mean(-1) + 1e-6)


@pytest.mark.parametrize("m,n,row_stride", [(1, 65536, 65536), (16, 4096, 4096),
                                            (300, 1000, 1064), (4096, 2048, 2048)])
def test_backward_replays_give_the_launchers_results_bit_for_bit(m, n, row_stride):
    """Every dw strategy's launches (the split's fill, split and reduction; one program writing
    dw itself; the column split's two kernels), recorded once and replayed on other tensors of
    the same layout, eagerly and in a CUDA graph, give what the launcher gives for those."""
    from kerneltune.kernels.rmsnorm_bwd import rmsnorm_bwd
    from kerneltune.runtime import replay

    replay.reset()
    sets = [_bwd_inputs(m, n, seed, row_stride) for seed in range(3)]
    for mode, config in _bwd_configs_by_mode(m, n).items():
        for inputs in sets:  # recorded on the first set, replayed on the others
            got = replay.run(replay.RMSNORM_BWD, config, id(config), *inputs, 0.0)
            expected = rmsnorm_bwd(*inputs, 0.0, config)
            assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True)), mode
        dy, x, w, rstd = sets[0]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = replay.run(replay.RMSNORM_BWD, config, id(config), dy, x, w, rstd, 0.0)
        for t, src in zip((dy, x, w), sets[1][:3], strict=True):
            t.copy_(src)
        rstd.copy_(sets[1][3])
        graph.replay()
        torch.cuda.synchronize()
        expected = rmsnorm_bwd(*sets[1], 0.0, config)
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True)), mode
    recordings = replay.RMSNORM_BWD.recordings
    assert recordings and all(rec is not None and rec.steps for rec in recordings.values())


def _split_args(name: str, m: int, n: int, seed: int) -> tuple:
    """The launcher's inputs of kernel `name` (the runtime's name) at (m, n), bf16."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x, r = (torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(2))
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=g)
    if name == "add_rmsnorm_fwd":
        return x, r, w, 1e-6, 0.0
    if name == "rmsnorm_quant_fwd":
        return x, w, None, 1e-6, "fp8"
    return x, w, 1e-6, 0.0


@pytest.mark.parametrize("k", [launch.RMSNORM_FWD, launch.RMSNORM_FWD_INFERENCE,
                               launch.ADD_RMSNORM_FWD, launch.RMSNORM_QUANT_FWD],
                         ids=lambda k: k.name)
@pytest.mark.parametrize("m,n", [(16, 65536), (3, 16384)])
def test_row_split_replays_give_the_launchers_results_bit_for_bit(k, m, n):
    """Every row split of the forward kernels at (m, n), called through `launch`: the first
    call described, the later ones recorded once and replayed (the slots filled anew) on other
    tensors of the same layout, eagerly and in a CUDA graph; each gives what its launcher gives
    for those tensors (of the inference forward, y: its rstd goes to a scratch vector)."""
    from kerneltune.kernels import REGISTRY
    from kerneltune.kernels._launch import run
    from kerneltune.runtime import replay

    launch.reset()
    replay.reset()
    spec = REGISTRY[k.name.removesuffix("_inference")]
    options = {"quant": "fp8"} if k is launch.RMSNORM_QUANT_FWD else {}
    splits = [c for c in spec.configs(spec.problem(m, n, "bfloat16", **options)) if c.COOP]
    kept = 1 if k is launch.RMSNORM_FWD_INFERENCE else None
    assert splits
    for config in splits[::max(1, len(splits) // 6)]:
        sets = [_split_args(k.name, m, n, seed) for seed in range(3)]
        for args in sets:
            got = launch.launch(k, config, id(config), *args)[:kept]
            expected = run(k.describe(*args, config))[:kept]
            assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True)), config
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = launch.launch(k, config, id(config), *sets[0])[:kept]
        for t, src in zip(sets[0], sets[1], strict=True):
            if isinstance(t, torch.Tensor):
                t.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        expected = run(k.describe(*sets[1], config))[:kept]
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True)), config
        assert id(config) in k.unbindable
    (replayed,) = k.replayed.args
    assert replayed.recordings and all(rec is not None and rec.steps
                                       for rec in replayed.recordings.values())


def test_a_launch_hook_sees_every_backward_launch():
    """With a profiler's hook installed the backward goes through Triton's launches, recording
    nothing, and gives the launcher's result."""
    from triton import knobs

    from kerneltune.kernels.rmsnorm_bwd import rmsnorm_bwd
    from kerneltune.kernels.rmsnorm_bwd_spec import SPEC
    from kerneltune.runtime import replay

    replay.reset()
    inputs = _bwd_inputs(16, 4096, 0, 4096)
    config = SPEC.default(SPEC.problem(16, 4096, "bfloat16"))
    seen = []
    hook = seen.append
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        got = replay.run(replay.RMSNORM_BWD, config, id(config), *inputs, 0.0)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert len(seen) >= 2 and replay.RMSNORM_BWD.recordings == {}
    expected = rmsnorm_bwd(*inputs, 0.0, config)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_eager_training_replays_the_backward_with_the_ops_gradients():
    from kerneltune.runtime import replay

    replay.reset()
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)

    def grads(fn):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        return torch.autograd.grad(fn(xs, ws), (xs, ws), dy)

    ours = [grads(kerneltune.rms_norm) for _ in range(3)]
    theirs = grads(lambda a, b: ops.rms_norm_op(a, b, 1e-6, 0.0)[0])
    assert all(torch.equal(a, b) for g in ours for a, b in zip(g, theirs, strict=True))
    (rec,) = replay.RMSNORM_BWD.recordings.values()
    assert rec is not None
    assert _is_bound(ops._RMS_NORM, x, w, 1e-6, 0.0)  # the forward too


def test_eager_training_of_the_fused_add_is_bound_and_gives_the_ops_gradients():
    """The autograd forward of `add_rms_norm` keeps rstd: it binds apart from inference's
    calls with the same arguments, and gives the custom op's outputs and gradients."""
    x, r, dy, ds = (torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    launch.reset()

    def run(fn):
        xs, rs, ws = (t.clone().requires_grad_() for t in (x, r, w))
        y, s = fn(xs, rs, ws)
        return (y, s, *torch.autograd.grad((y, s), (xs, rs, ws), (dy, ds)))

    with torch.inference_mode():
        inference = [kerneltune.add_rms_norm(x, r, w) for _ in range(2)]
    ours = [run(kerneltune.add_rms_norm) for _ in range(3)]
    theirs = run(lambda a, b, c: ops.add_rms_norm_op(a, b, c, 1e-6, 0.0)[:2])
    assert all(torch.equal(a, b) for o in ours for a, b in zip(o, theirs, strict=True))
    assert all(torch.equal(a, b) for o in inference for a, b in zip(o, theirs[:2], strict=True))
    assert _is_bound(ops._ADD_RMS_NORM, x, r, w, 1e-6, 0.0)
    assert _is_bound(ops._ADD_RMS_NORM_INFERENCE, x, r, w, 1e-6, 0.0)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_inputs_on_another_gpu_than_the_current_one_run_there():
    """Model code split over GPUs (``device_map="auto"``) calls a layer's norm with its tensors
    on cuda:1 while cuda:0 stays current: every function runs on cuda:1 and returns what it
    returns on cuda:0, bit for bit, eagerly (the checked first calls and the bound later ones)
    and with autograd; cuda:0 stays current."""
    here, there = torch.device("cuda", 0), torch.device("cuda", 1)
    torch.cuda.set_device(here)
    g = torch.Generator().manual_seed(0)
    x, res = (torch.randn(37, 4096, generator=g, dtype=torch.bfloat16) for _ in range(2))
    w = torch.randn(4096, generator=g, dtype=torch.bfloat16)

    def outputs(device: torch.device) -> list[torch.Tensor]:
        xd, rd, wd = x.to(device), res.to(device), w.to(device)
        with torch.inference_mode():
            for _ in range(3):
                got = [kerneltune.rms_norm(xd, wd), *kerneltune.add_rms_norm(xd, rd, wd),
                       *kerneltune.rms_norm_quant(xd, wd, quant="fp8"),
                       kerneltune.rms_norm_fake_quant(xd, wd)]
        xs, ws = xd.clone().requires_grad_(), wd.clone().requires_grad_()
        got += torch.autograd.grad(kerneltune.rms_norm(xs, ws), (xs, ws), rd)
        torch.cuda.synchronize(device)
        assert all(t.device == device for t in got)
        return [t.cpu() for t in got]

    expected = outputs(here)
    got = outputs(there)
    assert torch.cuda.current_device() == 0
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
               for a, b in zip(got, expected, strict=True))
