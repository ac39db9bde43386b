"""What `bench_kernels.py --resume` keeps: the shapes a partial result already holds."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_kernels import done_shapes, shape_key


def row(impl: str, m: int, n: int, **options: str) -> dict:
    return {"kernel": "rmsnorm_quant_fwd", "options": options, "m": m, "n": n, "impl": impl}


def test_a_shape_is_done_once_kerneltune_was_measured_on_it() -> None:
    rows = [row("copy (same bytes)", 16, 1024, quant="int8"),
            row("kerneltune-default", 16, 1024, quant="int8"), row("liger", 16, 1024, quant="int8"),
            row("copy (same bytes)", 16, 1024, quant="fp8")]  # cut off before kerneltune ran
    done = done_shapes(rows)
    assert done == {shape_key("rmsnorm_quant_fwd", {"quant": "int8"}, 16, 1024)}
    assert shape_key("rmsnorm_quant_fwd", {"quant": "fp8"}, 16, 1024) not in done
    assert shape_key("rmsnorm_quant_fwd", {"quant": "int8"}, 256, 1024) not in done
