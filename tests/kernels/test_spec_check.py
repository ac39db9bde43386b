"""`within_one_rounding`, the check behind every kernel's, and `check_by_rows`, the forward
kernels': in blocks of rows, they reach the verdict and name the worst element exactly as over
the whole tensor at once."""

from __future__ import annotations

import pytest
import torch

from kerneltune.kernels import REGISTRY, _spec
from kerneltune.kernels._spec import check_by_rows, within_one_rounding


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


def test_a_reference_by_rows_keeps_the_whole_references_floor(monkeypatch) -> None:
    ref = torch.cat([torch.full((1, 8), 1000.0), torch.full((3, 8), 1e-3)]).double()
    out = (ref + 1e-3).to(torch.bfloat16)
    monkeypatch.setattr(_spec, "CHECK_ELEMS", 8)
    seen: list[int] = []

    def reference(inputs: dict) -> tuple[torch.Tensor]:
        seen.append(len(inputs["v"]))
        return (inputs["v"],)

    assert check_by_rows(reference, ["v"], {"v": ref, "scale": 2.0}, [out]) is None
    assert seen == [1] * 8  # a first pass for the peaks, then the check, a row at a time
    assert check_by_rows(reference, ["v"], {"v": ref[1:]}, [out[1:]]).startswith("rows 0-0: ")
    assert check_by_rows(reference, ["v"], {"v": ref[:0]}, [out[:0]]) is None


@pytest.mark.parametrize("kernel", ["rmsnorm_fwd", "add_rmsnorm_fwd"])
def test_the_forward_kernels_check_a_block_of_rows_at_a_time(kernel: str, monkeypatch) -> None:
    """Their check never holds the reference of more than a block of rows (a large problem's
    float64 copy does not fit beside the tuner's), and reaches the whole check's verdicts."""
    spec = REGISTRY[kernel]
    problem = spec.problem(37, 300, "bfloat16")
    inputs = spec.make_inputs(problem, 0, "cpu")
    good = [t.to(torch.bfloat16) if t.dim() == 2 else t.float() for t in spec.reference(inputs)]
    bad = [t.clone() for t in good]
    bad[0][33, 5] = bad[0][33, 5] * 1.05 + 0.01
    assert spec.check(inputs, good) is None
    assert spec.check(inputs, bad).startswith("output 0: 1/11100 values off")
    monkeypatch.setattr(_spec, "CHECK_ELEMS", 8 * 300)
    seen: list[int] = []
    whole = spec.reference

    def reference(part: dict) -> tuple[torch.Tensor, ...]:
        seen.append(len(part["x"]))
        return whole(part)

    monkeypatch.setattr(spec, "reference", reference)
    assert spec.check(inputs, good) is None
    assert spec.check(inputs, bad).startswith("rows 32-36: output 0: 1/1500 values off")
    assert seen and max(seen) == 8


def test_quants_check_finds_a_non_finite_value_a_block_of_rows_at_a_time(monkeypatch) -> None:
    """A NaN in q, or an infinite scale, is named with its block of rows; no float copy of the
    whole q is made (it took 16 GiB at 16384 x 262144)."""
    spec = REGISTRY["rmsnorm_quant_fwd"]
    inputs = spec.make_inputs(spec.problem(37, 300, "bfloat16", quant="fp8"), 0, "cpu")
    q, scale = spec.reference(inputs)
    assert spec.check(inputs, (q, scale)) is None
    monkeypatch.setattr(_spec, "CHECK_ELEMS", 8 * 300)
    nan_q = q.clone()
    nan_q[33, 5] = torch.tensor(float("nan")).to(q.dtype)
    inf_scale = scale.clone()
    inf_scale[3] = float("inf")
    assert spec.check(inputs, (nan_q, scale)) == "non-finite values in q or scale, rows 32-36"
    assert spec.check(inputs, (q, inf_scale)) == "non-finite values in q or scale, rows 0-7"
