"""`quant_variants.py`: every variant's source edit still applies to the kernels as they are, the
variants that claim the right values compute them (real kernels under the interpreter), and the
configs timed are the table's pick and the valid completions of the probe's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from kerneltune.table import Entry, Table

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from quant_variants import (
    CORRECT,
    FWD,
    FWD_VARIANTS,
    GPU_ONLY,
    QUANT,
    VARIANTS,
    valid_configs,
    variant,
    wrong,
)

#: Whole rows in one warp and over several (the weight's load behind a barrier), and on a
#: persistent grid; at N = 1280, also in two blocks (1024 and a tail of 256).
CONFIGS = [{"ROWS": 2, "num_warps": 1}, {"ROWS": 2, "num_warps": 4},
           {"ROWS": 1, "num_warps": 2, "GRID_MULT": 2}]
TWO_BLOCKS = {"PARTS": 2, "BLOCK_N": 1024, "ROWS": 1, "num_warps": 4}
#: A split of one row a block over four chunks, loaded ahead or not: what `deep`,
#: `one_reduction` and `max_first` change.
SPLITS = [{"COOP": True, "SINGLE": False, "BLOCK_N": 512, "ROWS": 1, "num_warps": 2,
           "GRID_MULT": g, "num_stages": s} for g, s in ((1, 1), (2, 3))]
QUANT_CONFIGS = {1024: CONFIGS, 1280: [*CONFIGS[1:], TWO_BLOCKS], 2048: SPLITS}


def configs_of(spec, problem, partials):
    """Each partial config completed from the default; every one must run (none skipped)."""
    configs = [spec.normalize(problem, {**spec.default(problem), **c}) for c in partials]
    assert all(spec.valid(problem, c) for c in configs)
    return configs


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_quant_variant_applies_to_the_kernel(tmp_path, name):
    module = variant(name, tmp_path)
    source = Path(module.__file__).read_text()
    shipped = Path(QUANT.kernel_module.__file__).read_text()
    assert (source == shipped) == (VARIANTS[name] == [])


@pytest.mark.parametrize("name", sorted(set(CORRECT) - set(GPU_ONLY)))
@pytest.mark.parametrize("n", sorted(QUANT_CONFIGS))
def test_correct_quant_variants_match_the_reference(tmp_path, name, n):
    module = variant(name, tmp_path)
    g = torch.Generator().manual_seed(n)
    x = torch.randn(6, n, generator=g).bfloat16()
    w = (1 + 0.25 * torch.randn(n, generator=g)).bfloat16()
    problem = QUANT.problem(6, n, "bfloat16")
    for config in configs_of(QUANT, problem, QUANT_CONFIGS[n]):
        for mode in ("int8", "fp8"):
            out = module.rmsnorm_quant_fwd(x, w, None, 1e-6, mode, config, False)
            inputs = {"x": x, "weight": w, "bias": None, "eps": 1e-6, "quant": mode}
            assert QUANT.check(inputs, out) is None, (name, config, mode)


@pytest.mark.parametrize("name", sorted(set(FWD_VARIANTS) & set(CORRECT) - set(GPU_ONLY)))
def test_forward_variants_match_the_reference(tmp_path, name):
    module = variant(name, tmp_path, FWD, FWD_VARIANTS)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 1024, generator=g).bfloat16()
    w = (1 + 0.25 * torch.randn(1024, generator=g)).bfloat16()
    problem = FWD.problem(5, 1024, "bfloat16")
    for config in configs_of(FWD, problem, CONFIGS):
        out = module.rmsnorm_fwd(x, w, 1e-6, 0.0, config)
        assert FWD.check({"x": x, "weight": w, "eps": 1e-6, "offset": 0.0}, out) is None


@pytest.mark.parametrize("name", GPU_ONLY)
def test_gpu_only_variants_multiply_the_weight_in_bf16_pairs(tmp_path, name):
    for spec, variants in ((QUANT, VARIANTS), (FWD, FWD_VARIANTS)):
        if name in variants:
            source = Path(variant(name, tmp_path, spec, variants).__file__).read_text()
            assert "mul.rn.bf16x2" in source
            weights = [line for line in source.splitlines() if "tl.load(W + " in line]
            assert weights and not any(line.endswith(".to(tl.float32)") for line in weights)


@pytest.mark.parametrize("name", sorted(FWD_VARIANTS))
def test_each_forward_variant_applies_to_the_kernel(tmp_path, name):
    source = Path(variant(name, tmp_path, FWD, FWD_VARIANTS).__file__).read_text()
    shipped = Path(FWD.kernel_module.__file__).read_text()
    assert (source == shipped) == (FWD_VARIANTS[name] == [])


def test_a_variant_whose_text_is_gone_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="source text not found"):
        variant("edited", tmp_path, QUANT, {"edited": [("no such line", "")]})


def test_configs_are_the_pick_then_valid_completions_once_each():
    problem = QUANT.problem(4096, 1024, "bfloat16")
    pick = {**QUANT.default(problem), "ROWS": 2, "num_warps": 1}
    table = Table("GPU", entries=[
        Entry("rmsnorm_quant_fwd", "bfloat16", n=1024, m=4096, config=pick, us=5.7, gbps=2200.0,
              default_us=6.0, trials=32, kernel_hash="hash")])
    extra = [{"num_warps": 4}, {"num_warps": 1}, {"ROWS": 2, "num_warps": 4},
             {"GRID_MULT": 5}]  # the pick again, a repeat, and no such grid
    configs = valid_configs(QUANT, problem, extra, table)
    assert configs == [QUANT.normalize(problem, pick),
                       QUANT.normalize(problem, {**pick, "num_warps": 4})]


def test_configs_drop_what_the_kernel_does_not_take():
    """The probe's quant configs time the forward too, without quant's own parameters."""
    problem = FWD.problem(4096, 32768, "bfloat16")
    split = {"COOP": True, "SINGLE": False, "BLOCK_N": 4096, "ROWS": 1, "num_warps": 4,
             "GRID_MULT": 4, "num_stages": 3}
    configs = valid_configs(FWD, problem, [{**split, "X_LAYOUT": False, "PARTS": 1}], None)
    assert configs[1:] == [FWD.normalize(problem, {**FWD.default(problem), **split})]


def test_a_wrong_output_is_noted_and_a_right_one_is_not():
    """The sweep notes why a variant's output is wrong and goes on, rather than timing it."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 256, generator=g).bfloat16()
    w = (1 + 0.25 * torch.randn(256, generator=g)).bfloat16()
    inputs = {"x": x, "weight": w, "bias": None, "eps": 1e-6, "quant": "int8"}
    q, scale = QUANT.reference(inputs)
    row = {"m": 4, "n": 256}
    assert not wrong(QUANT, inputs, (q, scale), row, "wrong", "0/int8/shipped")
    assert "wrong" not in row
    assert wrong(QUANT, inputs, (q, scale * 2), row, "wrong", "0/int8/bad")
    assert list(row["wrong"]) == ["0/int8/bad"] and "scale of row" in row["wrong"]["0/int8/bad"]
