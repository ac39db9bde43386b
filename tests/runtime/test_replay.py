"""What a recording of a described call holds and when there is none. Replays themselves
launch compiled kernels, which the interpreter has not: `test_gpu.py` runs them against
Triton's own launches on a GPU."""

from __future__ import annotations

import pytest
import torch

from kerneltune.kernels import KernelConfig
from kerneltune.kernels._launch import Described
from kerneltune.kernels._spec import interpreting
from kerneltune.kernels.rmsnorm_bwd import rmsnorm_bwd
from kerneltune.kernels.rmsnorm_bwd_spec import SPEC
from kerneltune.runtime import replay

#: What the test descriptions are called with (they read none of it).
CONFIG = SPEC.default(SPEC.problem(3, 8, "float32"))


def _allocating(x: torch.Tensor, config: KernelConfig) -> Described:
    """Allocations and views only: a description whose torch work a replay repeats."""
    m, n = x.shape
    out = torch.empty((m, n), dtype=x.dtype)
    parts = torch.empty((2, m), dtype=torch.float32)
    first, _ = parts  # views
    return Described((out, torch.empty_like(first)), ())


def test_a_description_that_only_allocates_is_recorded_with_its_allocations():
    r = replay.Replayed("allocating", _allocating)
    x = torch.randn(3, 8, dtype=torch.float16)
    result = replay._record(r, CONFIG, ("key",), (x,))
    rec = r.recordings[("key",)]
    assert rec is not None and rec.steps == ()
    cpu = torch.device("cpu")
    assert rec.buffers == (((3, 8), (8, 1), torch.float16, cpu, None),
                           ((2, 3), (3, 1), torch.float32, cpu, None),
                           ((3,), (1,), torch.float32, cpu, None))
    assert rec.outputs == (0, 2)
    again = replay._replay(rec, (x,), 0)
    for a, b in zip(again, result, strict=True):
        assert (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype)
        assert a.data_ptr() != b.data_ptr()  # allocated afresh


def test_an_allocation_filled_with_a_constant_is_replayed_filled():
    """A split's slots made with ``torch.full``: recorded with their constant, and made anew,
    filled, on each replay (a fill of a tensor the description already has is not replayed)."""
    def slots(x: torch.Tensor, config: KernelConfig) -> Described:
        parts = torch.full((2, x.shape[0]), -1.0, dtype=torch.float32)
        return Described((torch.empty_like(x), parts), (), (parts,))

    r = replay.Replayed("slots", slots)
    x = torch.randn(3, 8)
    replay._record(r, CONFIG, ("key",), (x,))
    rec = r.recordings[("key",)]
    assert rec is not None and rec.buffers[0] == ((2, 3), (3, 1), torch.float32,
                                                  torch.device("cpu"), -1.0)
    first, second = (replay._replay(rec, (x,), 0) for _ in range(2))
    assert torch.equal(first[1], torch.full((2, 3), -1.0)) and torch.equal(second[1], first[1])
    assert first[1].data_ptr() != second[1].data_ptr()


def test_a_description_that_fills_or_copies_is_not_replayed():
    def filling(x: torch.Tensor, config: KernelConfig) -> Described:
        return Described((torch.zeros_like(x),), ())

    def copying(x: torch.Tensor, config: KernelConfig) -> Described:
        out = torch.empty_like(x)
        out.copy_(x)
        return Described((out,), ())

    x = torch.randn(2, 4)
    for describe in (filling, copying):
        r = replay.Replayed(describe.__name__, describe)
        (out,) = replay._record(r, CONFIG, ("key",), (x,))
        assert r.recordings == {("key",): None}  # the key's calls take Triton's launch
        assert torch.equal(out, x if describe is copying else torch.zeros_like(x))


def test_inputs_sharing_memory_are_not_recorded():
    r = replay.Replayed("allocating", lambda a, b, config: _allocating(a, config))
    x = torch.randn(4, 8)
    replay._record(r, CONFIG, ("key",), (x, x[1:]))
    assert r.recordings == {}


@pytest.mark.skipif(not interpreting(), reason="the interpreter's own path")
def test_the_interpreter_takes_tritons_launch_and_records_nothing():
    replay.reset()
    x, dy = torch.randn(5, 64), torch.randn(5, 64)
    w, rstd = torch.randn(64), torch.rand(5) + 0.5
    config = SPEC.default(SPEC.problem(5, 64, "float32"))
    dx, dw = replay.run(replay.RMSNORM_BWD, config, id(config), dy, x, w, rstd, 0.0)
    dx_ref, dw_ref = rmsnorm_bwd(dy, x, w, rstd, 0.0, config)
    assert torch.equal(dx, dx_ref) and torch.equal(dw, dw_ref)
    assert replay.RMSNORM_BWD.recordings == {}


def test_recordings_past_the_limit_start_over(monkeypatch):
    monkeypatch.setattr(replay, "_ENTRIES", 2)
    r = replay.Replayed("allocating", _allocating)
    x = torch.randn(3, 8)
    for key in ("a", "b", "c"):
        replay._record(r, CONFIG, (key,), (x,))
    assert list(r.recordings) == [("c",)]
