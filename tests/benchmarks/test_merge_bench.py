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


def test_merged_parts_keep_their_files_apart() -> None:
    """Two merged runs each hold a shard-0.json: a row still says which run's it is."""
    runs = [{"device": "NVIDIA H200", "processes": [{"copy_gbps": gbps}],
             "rows": rows(m, 1024, 5.0)} for m, gbps in ((1, 4272.0), (16, 4253.0))]
    a, b = (merge([("shard-0.json", run)]) for run in runs)
    merged = merge([("a/suite.json", a), ("b/suite.json", b)])
    sources = {p["source"]: p["copy_gbps"] for p in merged["processes"]}
    assert sources == {"a/suite.json:shard-0.json": 4272.0, "b/suite.json:shard-0.json": 4253.0}
    assert {(r["m"], r["source"]) for r in merged["rows"]} == {
        (1, "a/suite.json:shard-0.json"), (16, "b/suite.json:shard-0.json")}


def test_kernels_keeps_those_kernels_rows_only() -> None:
    quant = [{**r, "kernel": "rmsnorm_quant_fwd"} for r in rows(16, 1024, 7.0)]
    first = {"device": "NVIDIA H200", "rows": rows(1, 1024, 5.0) + quant}
    again = {"device": "NVIDIA H200", "rows": rows(1, 1024, 4.0)[:1]}
    merged = merge([("first.json", first), ("again.json", again)], {"rmsnorm_fwd"})
    assert [(r["kernel"], r["m"], r["gpu_us"]) for r in merged["rows"]] == [
        ("rmsnorm_fwd", 1, 4.0)]
    assert len(merge([("first.json", first)], {"rmsnorm_quant_fwd"})["rows"]) == 2


def test_results_of_different_devices_do_not_merge() -> None:
    a = {"device": "NVIDIA H200", "rows": []}
    b = {"device": "NVIDIA H100 80GB HBM3", "rows": []}
    with pytest.raises(ValueError, match="different devices"):
        merge([("a", a), ("b", b)])


RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
#: Each committed suite: its device, and the shapes it did not reach (none, each a whole run).
SUITES = {
    "nvidia-h100-80gb-hbm3/suite": ("NVIDIA H100 80GB HBM3", []),
    "nvidia-h100-80gb-hbm3/whole-suite": ("NVIDIA H100 80GB HBM3", []),
    "nvidia-h200/whole-suite": ("NVIDIA H200", []),
}


@pytest.mark.parametrize("folder", sorted(SUITES))
def test_a_committed_suite_covers_the_suite_each_shape_from_one_process(folder) -> None:
    from bench_kernels import SUITE_M, SUITE_N, shape_key, suite_shapes

    device, missing = SUITES[folder]
    result = json.loads((RESULTS / folder / "suite.json").read_text())
    assert result["device"] == device and result["env"]["triton"]
    sources: dict[tuple, set[str]] = defaultdict(set)
    for row in result["rows"]:
        sources[shape_key(row["kernel"], row["options"], row["m"], row["n"])].add(row["source"])
    assert all(len(s) == 1 for s in sources.values())
    kernels = ["rmsnorm_fwd", "rmsnorm_bwd", "add_rmsnorm_fwd", "rmsnorm_quant_fwd"]
    suite = suite_shapes(kernels, ["int8", "fp8"], SUITE_M, SUITE_N, "bfloat16")
    assert set(sources) == {shape_key(*shape) for shape in suite} - {
        shape_key(*shape) for shape in missing}


@pytest.mark.parametrize(("folder", "gpus"), [("nvidia-h100-80gb-hbm3/whole-suite", 4),
                                              ("nvidia-h200/whole-suite", 4)])
def test_the_one_run_took_each_shard_on_its_own_gpu_of_one_host(folder, gpus) -> None:
    result = json.loads((RESULTS / folder / "suite.json").read_text())
    listed = (RESULTS / folder / "gpu.txt").read_text()
    assert sorted({p["source"] for p in result["processes"]}) == [
        f"shard-{i}.json" for i in range(gpus)]
    for process in result["processes"]:
        assert f"GPU-{process['gpu_uuid']}" in listed
        assert process["shard"] == f"{process['source'][6]}/{gpus}"
    assert len({p["gpu_uuid"] for p in result["processes"]}) == gpus
