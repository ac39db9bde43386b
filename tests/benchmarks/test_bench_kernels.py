"""What `bench_kernels.py` measures: the suite's shapes, dealt out to one shard per GPU;
what `--resume` keeps (the rows of a partial result on the same device, and the shapes they
cover); on a GPU, that a shape's graph time is not skewed by its check."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_kernels import (
    MAX_TENSOR_BYTES,
    SUITE_M,
    SUITE_N,
    done_shapes,
    earlier_result,
    measure,
    shape_key,
    shard,
    suite_shapes,
)
from kerneltune.kernels import REGISTRY, interpreting
from kerneltune.tuner.timing import rotating_inputs


def row(impl: str, m: int, n: int, **options: str) -> dict:
    return {"kernel": "rmsnorm_quant_fwd", "options": options, "m": m, "n": n, "impl": impl}


KERNELS = ["rmsnorm_fwd", "rmsnorm_bwd", "add_rmsnorm_fwd", "rmsnorm_quant_fwd"]


def test_the_suite_has_every_kernel_mode_and_shape_under_the_size_limit() -> None:
    shapes = suite_shapes(KERNELS, ["int8", "fp8"], SUITE_M, SUITE_N, "bfloat16")
    fitting = [(m, n) for n in SUITE_N for m in SUITE_M if m * n * 2 <= MAX_TENSOR_BYTES]
    assert (16384, 262144) in fitting and len(fitting) == 78  # 8 GiB exactly: still measured
    assert len(shapes) == 5 * len(fitting) == len(set(map(repr, shapes)))
    assert shapes[:2] == [("rmsnorm_fwd", {}, 1, 1024), ("rmsnorm_fwd", {}, 16, 1024)]
    assert [s[:2] for s in shapes[-len(fitting) - 1:-len(fitting) + 1]] == [
        ("rmsnorm_quant_fwd", {"quant": "int8"}), ("rmsnorm_quant_fwd", {"quant": "fp8"})]
    # A float32 tensor of 16384 x 262144 is 16 GiB: past the limit.
    assert ("rmsnorm_fwd", {}, 16384, 262144) not in suite_shapes(
        ["rmsnorm_fwd"], [], SUITE_M, SUITE_N, "float32")


@pytest.mark.parametrize("count", [1, 2, 3, 4, 8])
def test_shards_split_the_suite_once_each_in_order_and_evenly(count: int) -> None:
    shapes = suite_shapes(KERNELS, ["int8", "fp8"], SUITE_M, SUITE_N, "bfloat16")
    shards = [shard(shapes, i, count) for i in range(count)]
    assert sorted(repr(s) for part in shards for s in part) == sorted(map(repr, shapes))
    for part in shards:
        assert part == [s for s in shapes if s in part]  # suite order within a shard

    def load(part: list) -> float:
        return sum(1.0 + m * n / 2**28 for _, _, m, n in part)

    loads = [load(p) for p in shards]
    largest = 1.0 + 16384 * 262144 / 2**28
    assert max(loads) - min(loads) <= largest, loads


def test_a_shard_index_outside_its_count_is_refused() -> None:
    with pytest.raises(ValueError, match=r"0\.\.3"):
        shard([("rmsnorm_fwd", {}, 1, 1024)], 4, 4)


def test_a_shape_is_done_once_kerneltune_was_measured_on_it() -> None:
    rows = [row("copy (same bytes)", 16, 1024, quant="int8"),
            row("kerneltune-default", 16, 1024, quant="int8"), row("liger", 16, 1024, quant="int8"),
            row("copy (same bytes)", 16, 1024, quant="fp8")]  # cut off before kerneltune ran
    done = done_shapes(rows)
    assert done == {shape_key("rmsnorm_quant_fwd", {"quant": "int8"}, 16, 1024)}
    assert shape_key("rmsnorm_quant_fwd", {"quant": "fp8"}, 16, 1024) not in done
    assert shape_key("rmsnorm_quant_fwd", {"quant": "int8"}, 256, 1024) not in done


def test_resume_reads_a_result_of_the_same_device_only(tmp_path) -> None:
    path = tmp_path / "bench.json"
    assert earlier_result(path, "NVIDIA H200") == {}  # nothing yet: start afresh
    before = {"device": "NVIDIA H200", "rows": [row("kerneltune", 16, 1024, quant="int8")],
              "processes": [{"copy_gbps": 4220.0}]}
    path.write_text(json.dumps(before))
    assert earlier_result(path, "NVIDIA H200") == before
    with pytest.raises(SystemExit, match="measured on NVIDIA H200"):
        earlier_result(path, "NVIDIA H100 80GB HBM3")


@pytest.mark.skipif(not torch.cuda.is_available() or interpreting(), reason="needs a GPU")
def test_a_multi_gigabyte_shape_is_timed_as_fast_in_a_graph_as_in_eager_calls() -> None:
    # 2 GB in and 2 GB out, checked against a float64 reference of 8 GB per tensor: a graph
    # captured after that check once ran 14% slower than the same kernel called eagerly.
    spec = REGISTRY["rmsnorm_fwd"]
    problem = spec.problem(16384, 65536, "bfloat16")
    config = spec.default(problem)
    sets = rotating_inputs(spec, problem, device="cuda")
    out = measure(spec, problem, "kerneltune-default",
                  lambda: lambda i: lambda: spec.run(i, config), True, sets, None, 1.0)
    assert out["gpu_us"] < 1.04 * out["eager_us"], out
