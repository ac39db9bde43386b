"""`within_one_rounding`, the check behind every kernel's: in blocks of rows, it reaches the
verdict and names the worst element exactly as over the whole tensor at once."""

from __future__ import annotations

import pytest
import torch

from kerneltune.kernels import _spec
from kerneltune.kernels._spec import within_one_rounding


def _case(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(37, 50, generator=g, dtype=torch.float64)
    out = ref.to(torch.bfloat16)
    extra = torch.rand(37, 1, generator=g, dtype=torch.float64) * 1e-3  # broadcast per row
    return out, ref, extra


@pytest.mark.parametrize("block_elems", [1, 50, 7 * 50, 1 << 24])
def test_blocks_of_rows_give_the_whole_tensors_verdict(block_elems: int, monkeypatch) -> None:
    out, ref, extra = _case(0)
    monkeypatch.setattr(_spec, "CHECK_ELEMS", block_elems)
    assert within_one_rounding(out, ref) is None
    assert within_one_rounding(out, ref, extra=extra) is None
    bad = out.clone()
    bad[3, 7] += 0.5
    bad[30, 1] -= 2.0  # the worst, in a later block
    why = within_one_rounding(bad, ref, extra=extra)
    flat = 30 * 50 + 1
    assert why is not None and why.startswith("2/1850 values off")
    assert f"worst at flat index {flat}: got {bad[30, 1].item():.8g}" in why
    nan = out.clone()
    nan[36, 49] = float("nan")
    assert within_one_rounding(nan, ref) == "1 non-finite values"


def test_the_floor_comes_from_the_whole_reference(monkeypatch) -> None:
    """Rows of tiny values next to a row of large ones get the large row's absolute floor in
    every block, as they would in one pass."""
    ref = torch.cat([torch.full((1, 8), 1000.0), torch.full((3, 8), 1e-3)]).double()
    out = (ref + 1e-3).to(torch.bfloat16)  # off by 1e-3: within 4 u x 1000 / 1024, not relative
    monkeypatch.setattr(_spec, "CHECK_ELEMS", 8)
    assert within_one_rounding(out, ref) is None
    assert within_one_rounding(out[1:], ref[1:]) is not None  # without the large row it fails


def test_vectors_and_scalars() -> None:
    v = torch.linspace(-3, 3, 1000, dtype=torch.float64)
    assert within_one_rounding(v.float(), v) is None
    assert within_one_rounding(torch.tensor(1.0), torch.tensor(1.0, dtype=torch.float64)) is None
    assert "flat index 0" in within_one_rounding(torch.tensor(1.5),
                                                 torch.tensor(1.0, dtype=torch.float64))
    assert within_one_rounding(torch.ones(0, 4), torch.ones(0, 4, dtype=torch.float64)) is None
    assert "shape" in within_one_rounding(torch.ones(2, 3), torch.ones(3, 2).double())
