"""Where the kernels launch with programmatic dependent launch: only a CUDA GPU of sm_90 or
later, never the CPU or the interpreter (which has no ``griddepcontrol``)."""

from __future__ import annotations

import pytest
import torch

from kerneltune.kernels import _spec
from kerneltune.kernels._spec import dependent_launch, overlaps_row_blocks


def test_no_dependent_launch_off_a_gpu_or_under_the_interpreter(monkeypatch):
    assert dependent_launch("cpu") is False
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert dependent_launch("cuda:0") is False  # decided before any CUDA call


@pytest.mark.parametrize(("capability", "expected"), [((8, 0), False), ((9, 0), True),
                                                      ((10, 0), True)])
def test_dependent_launch_from_sm_90(monkeypatch, capability, expected):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(_spec, "_cuda_capability", lambda index: capability)
    assert dependent_launch("cuda:0") is expected
    monkeypatch.setattr(torch.version, "hip", "6.2")  # ROCm counts capabilities otherwise
    assert dependent_launch("cuda:0") is False


@pytest.mark.parametrize(("pdl", "grid", "blocks", "expected"),
                         [(True, 64, 64, True), (True, 264, 100, True), (True, 264, 4096, False),
                          (False, 64, 64, False)])
def test_only_a_grid_of_one_row_block_a_program_overlaps(pdl, grid, blocks, expected):
    assert overlaps_row_blocks(pdl, grid, blocks) is expected
