"""The cooperative row split's grid and launches, and the hash that covers its shared code."""

from __future__ import annotations

import hashlib
import inspect

import pytest

from kerneltune.kernels import REGISTRY, _coop, rmsnorm_bwd, rmsnorm_quant


@pytest.mark.parametrize(("m", "rows", "chunks", "sms", "expected"), [
    (4096, 1, 8, 132, 16),  # as many lanes as fit one program per SM
    (3, 1, 8, 132, 3),  # never more than there are row blocks
    (5, 2, 8, 132, 3),
    (4096, 1, 200, 132, 1),  # wider than the GPU: one lane (then run step by step)
])
def test_lanes(m: int, rows: int, chunks: int, sms: int, expected: int) -> None:
    assert _coop.lanes(m, rows, chunks, sms) == expected


def test_one_waiting_launch_only_where_the_lane_is_resident(monkeypatch) -> None:
    monkeypatch.setattr(_coop, "interpreting", lambda: False)
    assert _coop.phases(chunks=8, sms=132, steps=2) == (0,)
    assert _coop.phases(chunks=133, sms=132, steps=2) == (1, 2, 3)
    assert _coop.phases(chunks=133, sms=132, steps=1) == (1, 2)
    monkeypatch.setattr(_coop, "interpreting", lambda: True)  # programs run one after another
    assert _coop.phases(chunks=8, sms=132, steps=2) == (1, 2, 3)


def _sha(*modules) -> str:
    return hashlib.sha256("".join(inspect.getsource(m) for m in modules).encode()).hexdigest()[:16]


def test_the_hash_covers_the_shared_device_code_a_kernel_calls() -> None:
    """An edit to `_coop` makes quant's tuned entries stale; a kernel without shared code keeps
    the hash of its own module alone (the tables tuned before stay current)."""
    assert REGISTRY["rmsnorm_quant_fwd"].kernel_hash == _sha(rmsnorm_quant, _coop)
    assert REGISTRY["rmsnorm_bwd"].kernel_hash == _sha(rmsnorm_bwd)
