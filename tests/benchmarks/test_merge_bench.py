"""`merge_bench.py`: a re-measured shape takes all its rows from the later result."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from merge_bench import merge


def rows(m: int, n: int, us: float) -> list[dict]:
    shape = {"kernel": "rmsnorm_fwd", "options": {}, "m": m, "n": n}
    return [{**shape, "impl": "kerneltune-default", "gpu_us": us},
            {**shape, "impl": "liger", "gpu_us": 2 * us}]


def test_a_later_result_replaces_the_shapes_it_measured_again() -> None:
    first = {"device": "NVIDIA H100 80GB HBM3", "copy_gbps": 3015.0,
             "processes": [{"copy_gbps": 3015.0}], "rows": rows(1, 1024, 5.0) + rows(16, 1024, 6.0)}
    again = {"device": "NVIDIA H100 80GB HBM3", "copy_gbps": 3012.0,
             "processes": [{"copy_gbps": 3012.0}], "rows": rows(16, 1024, 4.0)[:1]}
    merged = merge([("first.json", first), ("again.json", again)])
    assert merged["copy_gbps"] == 3012.0
    assert [p["source"] for p in merged["processes"]] == ["first.json", "again.json"]
    got = [(r["m"], r["impl"], r["gpu_us"], r["source"]) for r in merged["rows"]]
    # 16 x 1024 is all from the second file: liger, which it did not measure, is gone with it.
    assert got == [(1, "kerneltune-default", 5.0, "first.json"), (1, "liger", 10.0, "first.json"),
                   (16, "kerneltune-default", 4.0, "again.json")]


def test_results_of_different_devices_do_not_merge() -> None:
    a = {"device": "NVIDIA H200", "rows": []}
    b = {"device": "NVIDIA H100 80GB HBM3", "rows": []}
    with pytest.raises(ValueError, match="different devices"):
        merge([("a", a), ("b", b)])


def test_the_committed_h100_suite_covers_the_suite_each_shape_from_one_process() -> None:
    from bench_kernels import MAX_TENSOR_BYTES, SUITE_M, SUITE_N, shape_key

    path = (Path(__file__).resolve().parents[2] / "benchmarks" / "results"
            / "nvidia-h100-80gb-hbm3" / "suite" / "suite.json")
    result = json.loads(path.read_text())
    assert result["device"] == "NVIDIA H100 80GB HBM3" and result["env"]["triton"]
    sources: dict[tuple, set[str]] = defaultdict(set)
    for row in result["rows"]:
        sources[shape_key(row["kernel"], row["options"], row["m"], row["n"])].add(row["source"])
    assert all(len(s) == 1 for s in sources.values())
    suite = {(m, n) for m in SUITE_M for n in SUITE_N if m * n * 2 <= MAX_TENSOR_BYTES}
    for kernel, options in (("rmsnorm_fwd", {}), ("rmsnorm_bwd", {}), ("add_rmsnorm_fwd", {}),
                            ("rmsnorm_quant_fwd", {"quant": "int8"}),
                            ("rmsnorm_quant_fwd", {"quant": "fp8"})):
        shapes = {(m, n) for k, o, m, n in sources
                  if k == kernel and o == shape_key(kernel, options, 0, 0)[1]}
        assert shapes == suite, kernel
