"""The peers the benchmarks time kerneltune against compute what kerneltune computes: each one
(torch.compile aside, slow to build on a CPU) on a kernel's own inputs, checked against the
float64 reference with the benchmark's own peer check; the Triton ones under the interpreter."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from kerneltune.kernels import REGISTRY

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import one_row
from bench_kernels import peer_error, peer_error_by_rows
from kerneltune.kernels import _spec
from peers import PEERS

#: (kernel, options, N): 37 rows each; the group-quant N a multiple of its group size (0: one
#: group a row, per-token).
CASES = [("rmsnorm_fwd", {}, 300), ("rmsnorm_bwd", {}, 300), ("add_rmsnorm_fwd", {}, 300),
         ("rmsnorm_quant_fwd", {"quant": "int8"}, 300),
         ("rmsnorm_quant_fwd", {"quant": "fake"}, 300),
         ("layernorm_fwd", {}, 300), ("layernorm_bwd", {}, 300),
         ("rmsnorm_group_quant_fwd", {"quant": "fp8", "group_size": 64}, 256),
         ("rmsnorm_group_quant_fwd", {"quant": "int8", "group_size": 128, "scale_ue8m0": True,
                                      "column_major_scales": True}, 256),
         ("add_rmsnorm_group_quant_fwd", {"quant": "fp8", "group_size": 128,
                                          "column_major_scales": True}, 384),
         ("add_rmsnorm_group_quant_fwd", {"quant": "int8", "group_size": 0}, 300)]


#: Kernels whose peers return every output of the reference (the RMSNorm forward's peers leave
#: out the rstd it saves for the backward).
ALL_OUTPUTS = {"layernorm_fwd", "layernorm_bwd", "rmsnorm_group_quant_fwd",
               "add_rmsnorm_group_quant_fwd"}


def as_tuple(out: object) -> tuple:
    return tuple(out) if isinstance(out, tuple | list) else (out,)


@pytest.mark.parametrize(("kernel", "options", "n"), CASES, ids=lambda c: str(c))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_peer_matches_the_reference(kernel: str, options: dict, n: int, dtype: str
                                          ) -> None:
    spec = REGISTRY[kernel]
    problem = spec.problem(37, n, dtype, **options)
    inputs = spec.make_inputs(problem, seed=3, device="cpu")
    expected = as_tuple(spec.reference(inputs))
    peers = [p for p in PEERS[kernel]() if p.name != "torch.compile"]
    assert peers
    for peer in peers:
        out = as_tuple(peer.prepare()(inputs)())
        if kernel in ALL_OUTPUTS:  # the reference's outputs, in its order
            assert len(out) == len(expected), peer.name
        assert peer_error(out, expected, getattr(torch, dtype)) is None, peer.name
        if options.get("column_major_scales"):  # laid out as the kernel lays them out
            assert out[1].stride() == (1, 37), peer.name


def test_a_scale_is_held_to_the_precision_of_the_rows_it_comes_from() -> None:
    """A quant scale is fp32, but a peer that keeps the normed row unrounded (as inductor does)
    gets one a bf16 rounding away from the reference's: accepted for a bf16 problem only."""
    q = torch.arange(-64, 64, dtype=torch.int8)
    scale = torch.linspace(0.5, 2.0, 128)
    off = scale * (1 + 2.0**-8)  # half a bf16 unit
    assert peer_error((q, off), (q, scale), torch.bfloat16) is None
    assert "output 1" in peer_error((q, off), (q, scale), torch.float32)
    assert "output 1" in peer_error((q, 1.1 * scale), (q, scale), torch.bfloat16)


@pytest.mark.parametrize(("kernel", "options", "n"), CASES, ids=lambda c: str(c))
def test_a_peer_checked_a_block_of_rows_at_a_time_gets_the_whole_checks_verdict(
        kernel: str, options: dict, n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Five rows a block over 37: a right peer passes, and a wrong one fails on the same
    output with the same relative error as against the whole reference, whether the error
    lies in a row-indexed output or in the backward's dw, which sums every block."""
    spec = REGISTRY[kernel]
    inputs = spec.make_inputs(spec.problem(37, n, "bfloat16", **options), seed=5, device="cpu")
    whole = spec.reference(inputs)
    peer = next(p for p in PEERS[kernel]() if p.name == "torch-eager")
    out = as_tuple(peer.prepare()(inputs)())
    monkeypatch.setattr(_spec, "CHECK_ELEMS", 5 * n)
    assert len(_spec.row_blocks(37, n)) == 8
    assert peer_error_by_rows(spec, inputs, out, torch.bfloat16) is None

    for k in [0, *spec.summed_outputs]:
        wrong = list(out)
        wrong[k] = wrong[k].clone()
        part = slice(21, 23) if wrong[k].dim() == 2 else slice(40)  # rows of the fifth block
        # in fp32 and back: fp8 has no arithmetic of its own
        wrong[k][part] = (wrong[k][part].float() * 1.5 + 1).to(wrong[k].dtype)
        expected = peer_error(wrong, whole, torch.bfloat16)
        assert expected is not None and expected.startswith(f"output {k}:")
        assert peer_error_by_rows(spec, inputs, wrong, torch.bfloat16) == expected


def test_one_row_peers_exist_for_forward_and_backward() -> None:
    assert "triton one-row" in {p.name for p in PEERS["rmsnorm_fwd"]()}
    assert "triton one-row" in {p.name for p in PEERS["rmsnorm_bwd"]()}


def test_one_row_backward_sums_every_rows_dw() -> None:
    spec = REGISTRY["rmsnorm_bwd"]
    inputs = spec.make_inputs(spec.problem(9, 100, "float32"), seed=1, device="cpu")
    dx, dw = one_row.rms_norm_backward(inputs["dy"], inputs["x"], inputs["weight"],
                                       inputs["rstd"])
    ref_dx, ref_dw = spec.reference(inputs)
    assert torch.allclose(dx.double(), ref_dx, rtol=1e-5, atol=1e-5)
    assert torch.allclose(dw.double(), ref_dw, rtol=1e-5, atol=1e-4)


def test_one_row_does_not_attempt_huge_rows() -> None:
    x = torch.empty(1, one_row.MAX_BLOCK + 1)
    with pytest.raises(ValueError, match="not attempted"):
        one_row.rms_norm(x, torch.empty(one_row.MAX_BLOCK + 1), 1e-6)
