"""The kernels' launch descriptions as the fast launch path and bound calls consume them (what
they launch on a GPU), and the fallback to Triton's own launch wherever they cannot be used."""

from __future__ import annotations

import operator
import warnings
from types import SimpleNamespace

import pytest
import torch

import kerneltune
from kerneltune.kernels import (
    REGISTRY,
    KernelConfig,
    QuantConfig,
    _coop,
    add_rmsnorm_spec,
    layernorm_spec,
    rmsnorm_fwd_spec,
    rmsnorm_group_quant_spec,
    rmsnorm_quant_spec,
)
from kerneltune.kernels._launch import run
from kerneltune.kernels._spec import sm_count
from kerneltune.runtime import _launchers, launch

from .conftest import DEVICE

interpreter_only = pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter's path; "
                                      "test_gpu.py has the compiled one")


def some_configs(spec, m: int, n: int, dtype: str, **options) -> list[KernelConfig]:
    """The default, a looped one, a several-rows one, and where the kernel has them one of the
    row in two blocks, one on a persistent grid and one storing in x's layout (the interpreter
    is slow: a few)."""
    problem = spec.problem(m, n, dtype, **options)
    every = [c for c in spec.configs(problem) if c.BLOCK_N <= 1024 and c.num_warps <= 2]
    looped = next(c for c in every if not c.SINGLE and not c.COOP and not c.EVICT)
    rows = next(c for c in every if c.SINGLE and c.ROWS > 1)
    quant = [c for c in every if isinstance(c, QuantConfig)]
    two_blocks = [c for c in quant if c.PARTS == 2][:1]
    persistent = [c for c in every if c.GRID_MULT > 1 and not c.COOP][-1:]
    x_layout = [c for c in quant if c.X_LAYOUT][:1]
    return [spec.default(problem), looped, rows, *two_blocks, *persistent, *x_layout]


def inputs_for(kernel: str, m: int, n: int, dtype: torch.dtype, variant) -> tuple:
    g = torch.Generator().manual_seed(m + n)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(DEVICE, dtype)

    x = randn(m, n + 16)[:, 8:8 + n]  # strided rows
    w = randn(n)
    if kernel == "rmsnorm_fwd":
        return (x, w, 1e-6, variant)
    if kernel == "add_rmsnorm_fwd":
        return (x, randn(m, n), w, 1e-6, variant)
    quant, has_w, has_b = variant
    return (x, w if has_w else None, randn(n) if has_b else None, 1e-6, quant)


KERNELS = [
    (launch.RMSNORM_FWD, rmsnorm_fwd_spec.SPEC, [0.0, 1.0]),
    (launch.RMSNORM_FWD_INFERENCE, rmsnorm_fwd_spec.SPEC, [0.0, 1.0]),
    (launch.ADD_RMSNORM_FWD, add_rmsnorm_spec.SPEC, [0.0, 1.0]),
    (launch.RMSNORM_QUANT_FWD, rmsnorm_quant_spec.SPEC,
     [("int8", True, False), ("fp8", True, False), ("fake", False, False),
      ("fake", True, True)]),
]

#: The kernels' arguments, named as in the specs' inputs.
LAUNCHER_ARGS = {"rmsnorm_fwd": ("x", "weight", "eps", "offset"),
                 "add_rmsnorm_fwd": ("x", "residual", "weight", "eps", "offset"),
                 "rmsnorm_quant_fwd": ("x", "weight", "bias", "eps", "quant")}


def named(spec, inputs: tuple) -> dict:
    """A kernel's arguments as its spec's inputs (for `spec.check`)."""
    return dict(zip(LAUNCHER_ARGS[spec.name], inputs, strict=True))


@pytest.mark.parametrize("k,spec,variants", KERNELS, ids=lambda k: getattr(k, "name", ""))
def test_a_config_of_one_block_a_row_is_described_as_one_launch(k, spec, variants):
    """What the fast path compiles and binds: one launch on a 1-D grid whose runtime arguments
    lead the kernel's parameters, the rest (constexprs, PDL off for an eager launch) filled in
    by keyword; run, it computes the reference's answer."""
    for dtype in (torch.float32, torch.bfloat16):
        for variant in variants:
            options = {"quant": variant[0]} if spec is rmsnorm_quant_spec.SPEC else {}
            m, n = 3, 600  # long enough to loop over 512-element chunks
            for config in some_configs(spec, m, n, str(dtype).split(".")[1], **options):
                inputs = inputs_for(spec.name, m, n, dtype, variant)
                call = k.describe(*inputs, config, pdl=False)
                (step,) = call.launches
                assert len(step.grid) == 1 and not call.scratch
                values = step.bound_values()
                assert len(values) == len(step.kernel.arg_names)
                assert all(v is a for v, a in zip(values, step.args, strict=False))
                assert dict(zip(step.kernel.arg_names, values, strict=True))["PDL"] is False
                assert {k: step.meta[k] for k in config.launch_options} == config.launch_options
                assert spec.check(named(spec, inputs), run(call)) is None, config


@pytest.mark.parametrize("k", [launch.RMSNORM_FWD, launch.ADD_RMSNORM_FWD,
                               launch.RMSNORM_QUANT_FWD], ids=lambda k: k.name)
def test_a_row_split_makes_its_slots_anew_each_call(k):
    """A cooperative split's partial slots are scratch: described with the call, set to UNSET
    by it, never kept by a bound call (a kept one would hold the last call's partials)."""
    spec = REGISTRY[k.name]
    problem = spec.problem(1, 4096, "float32")
    split = max((c for c in spec.configs(problem) if c.COOP), key=lambda c: c.BLOCK_N)
    inputs = spec.make_inputs(problem, 0, DEVICE)
    args = tuple(inputs[a] for a in LAUNCHER_ARGS[k.name])
    first, second = (k.describe(*args, split) for _ in range(2))
    assert first.scratch and first.launches
    assert first.scratch[0].data_ptr() != second.scratch[0].data_ptr()
    assert (first.scratch[0] == _coop.UNSET.value).all()
    assert spec.check(inputs, launch.launch(k, split, id(split), *args)) is None
    hooks = SimpleNamespace(runtime=SimpleNamespace(launch_enter_hook=None))
    device = args[0].get_device()
    driver = _launchers.Driver(lambda: device, lambda d: 0, hooks)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_launchers, "_driver", driver)
        mp.setattr(_launchers, "capturing", lambda: False)
        mp.setattr(launch, "_bound", {})
        mp.setitem(k.compiled, (id(split), k.variant(*args), device,
                                launch._arg_key(first.launches[0].args), False),
                   lambda *launched: None)
        launch.bind("split", k, split, args, args, first.outputs)
        assert launch._bound == {} and id(split) in k.unbindable
        described = []
        mp.setattr(k, "describe", lambda *a, **kw: described.append(a))
        launch.bind("split", k, split, args, args, first.outputs)  # known: not described again
        assert described == [] and launch._bound == {}


@pytest.mark.parametrize("k", [launch.RMSNORM_FWD, launch.ADD_RMSNORM_FWD,
                               launch.RMSNORM_QUANT_FWD], ids=lambda k: k.name)
def test_a_row_splits_later_calls_go_to_the_replay(k, monkeypatch):
    """`launch` describes a split's first call itself and learns from its scratch that the
    config is never bound; its later calls go to `kerneltune.runtime.replay`, which records
    their key once (here, under the interpreter, that there is no compiled kernel to replay,
    so that they take Triton's launch) and gives the kernel's results every time."""
    spec = REGISTRY[k.name]
    problem = spec.problem(3, 4096, "float32")
    split = max((c for c in spec.configs(problem) if c.COOP), key=lambda c: c.BLOCK_N)
    inputs = spec.make_inputs(problem, 0, DEVICE)
    args = tuple(inputs[a] for a in LAUNCHER_ARGS[k.name])
    hooks = SimpleNamespace(runtime=SimpleNamespace(launch_enter_hook=None))
    device = args[0].get_device()
    driver = _launchers.Driver(lambda: device, lambda d: 0, hooks)
    monkeypatch.setattr(_launchers, "_driver", driver)
    monkeypatch.setattr(_launchers, "_driver_checked", True)
    monkeypatch.setattr(_launchers, "capturing", lambda: False)
    for _ in range(3):
        assert spec.check(inputs, launch.launch(k, split, id(split), *args)) is None
    assert id(split) in k.unbindable
    (replayed,) = k.replayed.args  # functools.partial(replay.run, the Replayed)
    assert len(replayed.recordings) == 1


def test_an_empty_call_leaves_its_config_bindable(monkeypatch):
    """A call of no rows launches nothing, so nothing is bound; its config (the one-row
    bucket's, which decode calls share) is no split, and its next calls must still bind, not
    go to the replay."""
    k = launch.RMSNORM_FWD
    spec = REGISTRY[k.name]
    config = spec.default(spec.problem(1, 64, "float32"))
    x, w = torch.randn(0, 64, device=DEVICE), torch.randn(64, device=DEVICE)
    args = (x, w, 1e-6, 0.0)
    hooks = SimpleNamespace(runtime=SimpleNamespace(launch_enter_hook=None))
    device = x.get_device()
    monkeypatch.setattr(_launchers, "_driver", _launchers.Driver(lambda: device, lambda d: 0,
                                                                 hooks))
    monkeypatch.setattr(_launchers, "capturing", lambda: False)
    monkeypatch.setattr(launch, "_bound", {})
    monkeypatch.setattr(k, "unbindable", set())
    y, rstd = run(k.describe(*args, config))
    launch.bind("empty", k, config, args, args, (y, rstd))
    assert launch._bound == {} and id(config) not in k.unbindable


@interpreter_only
def test_interpreter_takes_tritons_launch():
    assert _launchers.fast_driver() is None
    x, w = torch.randn(4, 32), torch.randn(32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kerneltune.rms_norm(x, w)
    assert launch.RMSNORM_FWD.compiled == {}


def test_arg_key_tells_apart_what_triton_specialises_on():
    t = torch.empty(64)
    assert launch._arg_key((t, 16, 3, 1.5)) == launch._arg_key((torch.empty(64), 32, 5, 2.5))
    assert launch._arg_key((t, 16)) != launch._arg_key((t[1:], 16))  # misaligned pointer
    assert launch._arg_key((t, 16)) != launch._arg_key((t, 17))  # divisibility by 16
    assert launch._arg_key((t, 1)) != launch._arg_key((t, 3))  # equal to one
    assert launch._arg_key((t, 3)) != launch._arg_key((t, 2**40 + 3))  # 64-bit
    assert launch._arg_key((t,)) != launch._arg_key((t.half(),))  # dtype
    assert launch._arg_key((True,)) != launch._arg_key((False,))


def test_an_empty_hook_chain_is_no_hook():
    """Triton keeps an always-present, usually empty, chain of launch hooks: only a chain with a
    hook in it (a profiler) sends launches through Triton's own launcher."""
    from triton.knobs import HookChain

    chain = HookChain()
    assert not _launchers.launch_hooked(None) and not _launchers.launch_hooked(chain)
    chain.add(lambda metadata: None)
    assert _launchers.launch_hooked(chain)
    assert _launchers.launch_hooked(lambda metadata: None)  # Triton before 3.4: the hook itself


def test_call_key_tells_apart_what_a_bound_call_depends_on():
    x, w = torch.empty(4, 64), torch.empty(64)
    key = launch.call_key("rms_norm", (x, w, 1e-6, 0.0))
    assert key == launch.call_key("rms_norm", (torch.empty(4, 64), torch.empty(64), 1e-6, 0.0))
    assert launch.call_key("rms_norm inference", (x, w, 1e-6, 0.0)) != key  # another site
    for other in [
        (torch.empty(4, 128)[:, :64], w, 1e-6, 0.0),  # row stride
        (torch.empty(4, 65)[:, 1:], w, 1e-6, 0.0),  # alignment
        (x.view(2, 2, 64), w, 1e-6, 0.0),  # shape
        (x.half(), w, 1e-6, 0.0),
        (x, w.half(), 1e-6, 0.0),
        (x, torch.empty(128)[::2], 1e-6, 0.0),  # weight stride
        (x, torch.nn.Parameter(w), 1e-6, 0.0),  # tensor type
        (x, w, 1e-5, 0.0),
        (x, w, 1e-6, 1.0),
        (x, w, True, 0.0),  # equal to 1.0, but no valid eps
        (x, w, 1e-6, 0),
        (x, None, 1e-6, 0.0),
    ]:
        assert launch.call_key("rms_norm", other) != key
    assert (launch.call_key("quant", (x, None, None, 1e-6, "int8"))
            != launch.call_key("quant", (x, None, None, 1e-6, "fp8")))
    with pytest.raises(TypeError):  # unhashable: never a bound call's
        hash(launch.call_key("rms_norm", ([[1.0]], w, 1e-6, 0.0)))


@interpreter_only
def test_nothing_is_bound_without_compiled_kernels():
    """Under the interpreter every call takes the checked path, errors included."""
    x, w = torch.randn(4, 64), torch.randn(64)
    with torch.inference_mode():
        kerneltune.rms_norm(x, w)
        kerneltune.rms_norm(x, w)
        kerneltune.add_rms_norm(x, x, w)
        kerneltune.rms_norm_quant(x, w)
        kerneltune.layer_norm(x, w)
        kerneltune.rms_norm_group_quant(x, w, group_size=32)
        kerneltune.add_rms_norm_quant(x, x, w, group_size=32)
    assert not launch._bound
    with pytest.raises(ValueError):
        kerneltune.rms_norm(x, w, eps=-1.0)


def test_a_persistent_grid_whose_programs_loop_is_launched_the_ordinary_way():
    """Asked for a programmatic dependent launch (as while a graph is captured), quant's
    description makes none for a persistent grid whose programs loop over row blocks."""
    spec = rmsnorm_quant_spec.SPEC
    m, n = 16 * sm_count(DEVICE), 256  # more rows than any persistent grid has programs
    problem = spec.problem(m, n, "float32", quant="int8")
    config = next(c for c in spec.configs(problem)
                  if c.GRID_MULT > 1 and not c.COOP and c.ROWS == 1)
    inputs = inputs_for(spec.name, m, n, torch.float32, ("int8", True, False))
    call = launch.RMSNORM_QUANT_FWD.describe(*inputs, config, pdl=True)
    (step,) = call.launches
    assert step.grid[0] < m  # its programs loop
    assert step.meta["PDL"] is False and step.meta["launch_pdl"] is False
    assert spec.check(named(spec, inputs), run(call)) is None


def test_a_bound_call_launches_its_arguments_and_steps_aside_while_a_graph_is_captured(
        monkeypatch):
    """A bound call passes its tensors' and new outputs' addresses, then the constants, in
    the kernel's order. A captured call must take `launch`, which makes it a dependent launch:
    the bound launch (torch's C++ launcher, none) is not made while a graph is captured."""
    x, w = torch.randn(4, 64), torch.randn(64)
    launched = []
    hooks = SimpleNamespace(runtime=SimpleNamespace(launch_enter_hook=None))
    monkeypatch.setattr(_launchers, "_driver", _launchers.Driver(lambda: x.get_device(),
                                                          lambda device: 0, hooks))
    binding = launch._Binding(
        allocate=lambda x: (torch.empty_like(x),), take=operator.itemgetter(0, 1),
        pick=operator.itemgetter(0, 2, 1, 3), kernel=lambda *call: launched.append(call),
        grid=4, device=x.get_device(), constants=(64,), kept=())
    monkeypatch.setitem(launch._bound, launch.call_key("rms_norm", (x, w, 1e-6, 0.0)), binding)
    monkeypatch.setattr(_launchers, "capturing", lambda: False)
    (y,) = launch.run_bound("rms_norm", x, w, 1e-6, 0.0)
    assert y.shape == x.shape and y.data_ptr() not in (x.data_ptr(), w.data_ptr())
    assert launched == [(4, 0, (x.data_ptr(), y.data_ptr(), w.data_ptr(), 64))]
    assert launch.run_bound("rms_norm inference", x, w, 1e-6, 0.0) is None  # another call site
    monkeypatch.setattr(_launchers, "capturing", lambda: True)
    assert launch.run_bound("rms_norm", x, w, 1e-6, 0.0) is None
    assert len(launched) == 1


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.view(-1, x.shape[-1])


def _plan(name: str) -> launch.Kernel:
    """The runtime's fast launch of kernel `name` (registered by the module that calls it)."""
    return next(k for k in launch._kernels if k.name == name)


#: (call site, kernel, spec, options, arguments from (x, w, b, r), the kernel's inputs from the
#: arguments, which of the described outputs the site keeps, their shapes as it returns them
#: given x).
BIND_CASES = {
    "rms_norm inference": (
        launch.RMSNORM_FWD_INFERENCE, rmsnorm_fwd_spec.SPEC, {},
        lambda x, w, b, r: (x, w, 1e-6, 0.0), lambda a: (_rows(a[0]), *a[1:]), (True, False),
        lambda x: (x.shape,)),
    "rms_norm, 3-d, Gemma": (
        launch.RMSNORM_FWD, rmsnorm_fwd_spec.SPEC, {},
        lambda x, w, b, r: (x.view(3, 2, -1), w, 1e-6, 1.0), lambda a: (_rows(a[0]), *a[1:]),
        (True, True), lambda x: (x.shape, x.shape[:-1])),
    "add_rms_norm inference": (
        launch.ADD_RMSNORM_FWD, add_rmsnorm_spec.SPEC, {},
        lambda x, w, b, r: (x, r, w, 1e-6, 0.0), lambda a: a, (True, True, False),
        lambda x: (x.shape, x.shape)),
    "add_rms_norm": (
        launch.ADD_RMSNORM_FWD, add_rmsnorm_spec.SPEC, {},
        lambda x, w, b, r: (x, r, w, 1e-6, 0.0), lambda a: a, (True, True, True),
        lambda x: (x.shape, x.shape, x.shape[:-1])),
    "rms_norm_quant": (
        launch.RMSNORM_QUANT_FWD, rmsnorm_quant_spec.SPEC, {"quant": "int8"},
        lambda x, w, b, r: (x, w, None, 1e-6, "int8"), lambda a: a, (True, True),
        lambda x: (x.shape, (*x.shape[:-1], 1))),
    "rms_norm_fake_quant, bias alone": (
        launch.RMSNORM_QUANT_FWD, rmsnorm_quant_spec.SPEC, {"quant": "fake"},
        lambda x, w, b, r: (x, None, b, 1e-5, "fake"), lambda a: a, (True, False),
        lambda x: (x.shape,)),
    "layer_norm inference": (
        _plan("layernorm_fwd"), layernorm_spec.FWD, {},
        lambda x, w, b, r: (x, w, b, 1e-5), lambda a: a, (True, False, False),
        lambda x: (x.shape,)),
    "layer_norm, 3-d, no weight": (
        _plan("layernorm_fwd"), layernorm_spec.FWD, {},
        lambda x, w, b, r: (x.view(3, 2, -1), None, b, 1e-5), lambda a: (_rows(a[0]), *a[1:]),
        (True, True, True), lambda x: (x.shape, x.shape[:-1], x.shape[:-1])),
    "rms_norm_group_quant": (
        _plan("rmsnorm_group_quant_fwd"), rmsnorm_group_quant_spec.FWD,
        {"quant": "fp8", "group_size": 32},
        lambda x, w, b, r: (x, None, w, 1e-6, "fp8", 32, False, False), lambda a: a,
        (True, True), lambda x: (x.shape, (*x.shape[:-1], 3))),
    "add_rms_norm_quant": (
        _plan("rmsnorm_group_quant_fwd"), rmsnorm_group_quant_spec.ADD_FWD,
        {"quant": "int8", "group_size": 32},
        lambda x, w, b, r: (x, r, w, 1e-6, "int8", 32, True, False), lambda a: a,
        (True, True, True), lambda x: (x.shape, (*x.shape[:-1], 3), x.shape)),
}


@pytest.mark.parametrize("site", list(BIND_CASES))
def test_a_bound_call_passes_what_its_description_passes_for_new_tensors(monkeypatch, site):
    """`bind` on a call, then `run_bound` on new tensors of the same layout: the kernel gets
    what the description lists for those tensors (their addresses, the new outputs', the kept
    buffers of the outputs the site drops, the same scalars), on the described grid. Here a fake
    driver stands in for the GPU and a recording function for the compiled kernel."""
    plan, spec, options, make_args, make_inputs, keep, shapes = BIND_CASES[site]
    m, n = 6, 96
    g = torch.Generator().manual_seed(0)

    def call_arguments() -> tuple:
        x, r = (torch.randn(m, n + 16, generator=g)[:, 8:8 + n] for _ in range(2))
        w, b = (torch.randn(n, generator=g) for _ in range(2))
        args = make_args(x, w, b, r)
        return args, make_inputs(args)

    args, inputs = call_arguments()
    config = spec.default(spec.problem(m, n, "float32", **options))
    call = plan.describe(*inputs, config, pdl=False)
    device, seen = args[0].get_device(), []
    hooks = SimpleNamespace(runtime=SimpleNamespace(launch_enter_hook=None))
    driver = _launchers.Driver(lambda: device, lambda d: 7, hooks)
    monkeypatch.setattr(_launchers, "_driver", driver)
    monkeypatch.setattr(_launchers, "capturing", lambda: False)
    monkeypatch.setattr(launch, "_bound", {})
    monkeypatch.setitem(plan.compiled, (id(config), plan.variant(*inputs), device,
                                        launch._arg_key(call.launches[0].args), False),
                        lambda *launched: seen.append(launched))
    kept = [o for o, k in zip(call.outputs, keep, strict=True) if k]
    returned = [o.view(s) for o, s in zip(kept, shapes(args[0]), strict=True)]
    outputs = iter(returned)
    launch.bind(site, plan, config, args, inputs, tuple(next(outputs) if k else None
                                                        for k in keep))
    (binding,) = launch._bound.values()
    # The kept buffers of the dropped outputs, in the order the kernel takes them.
    dropped = iter([t for t in binding.kept if isinstance(t, torch.Tensor)])

    args, inputs = call_arguments()
    out = launch.run_bound(site, *args)
    expected_call = plan.describe(*inputs, config, pdl=False)
    (step,) = expected_call.launches
    new = dict(zip([j for j, k in enumerate(keep) if k], out, strict=True))  # by output
    expected = []
    for a in step.args:
        if not isinstance(a, torch.Tensor):
            expected.append(a)
        elif any(a is t for t in inputs):
            expected.append(a.data_ptr())
        else:
            j = next(j for j, o in enumerate(expected_call.outputs) if a is o)
            expected.append((new[j] if keep[j] else next(dropped)).data_ptr())
    assert seen == [(step.grid[0], 7, tuple(expected))]
    assert [(t.shape, t.dtype) for t in out] == [(t.shape, t.dtype) for t in returned]
    assert all(t.is_contiguous() for t in out)
    assert launch.run_bound(site, *args[:-1], "other") is None  # another key
