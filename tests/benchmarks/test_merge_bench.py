"""`merge_bench.py`: a re-measured shape takes all its rows from the later result; the shards
of a run, measured by `bench_kernels.py` under the interpreter, merge into a suite that
`kerneltune report` draws; each committed suite covers the whole suite, each shape's rows from
one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from merge_bench import merge

ROOT = Path(__file__).resolve().parents[2]


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


def test_a_suite_merged_into_itself_keeps_its_rows_sources(tmp_path) -> None:
    """New rows merged into the suite file itself: the suite's rows and processes keep the
    names they have, instead of being named after the suite a second time."""
    shards = [{"device": "NVIDIA H200", "processes": [{"copy_gbps": 4272.0}],
               "rows": rows(m, 1024, 5.0)} for m in (1, 16)]
    suite = merge([("shard-0.json", shards[0]), ("shard-1.json", shards[1])])
    (tmp_path / "suite.json").write_text(json.dumps(suite))
    again = {"device": "NVIDIA H200", "processes": [{"copy_gbps": 4270.0}],
             "rows": rows(16, 1024, 4.0)}
    (tmp_path / "again.json").write_text(json.dumps(again))
    run("merge_bench.py", "suite.json", "again.json", "--out", "suite.json", cwd=tmp_path)
    merged = json.loads((tmp_path / "suite.json").read_text())
    assert [p["source"] for p in merged["processes"]] == [
        "shard-0.json", "shard-1.json", "again.json"]
    assert {(r["m"], r["gpu_us"], r["source"]) for r in merged["rows"]} == {
        (1, 5.0, "shard-0.json"), (1, 10.0, "shard-0.json"), (16, 4.0, "again.json"),
        (16, 8.0, "again.json")}


def test_a_plain_result_merged_into_itself_names_its_rows_after_itself() -> None:
    """A result of one process (no sources yet) as the merge's own output: its rows and
    processes are named after it, as any part's."""
    first = {"device": "NVIDIA H200", "processes": [{"copy_gbps": 4272.0}],
             "rows": rows(1, 1024, 5.0)}
    again = {"device": "NVIDIA H200", "processes": [{"copy_gbps": 4270.0}],
             "rows": rows(16, 1024, 4.0)}
    merged = merge([("run.json", first), ("again.json", again)], into="run.json")
    assert [p["source"] for p in merged["processes"]] == ["run.json", "again.json"]
    assert {(r["m"], r["source"]) for r in merged["rows"]} == {(1, "run.json"),
                                                                (16, "again.json")}


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


def run(script: str, *args: str, cwd: Path) -> str:
    """A script of `benchmarks/` run under the interpreter in `cwd`."""
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_shards_of_a_run_merge_into_a_suite_that_reports(tmp_path) -> None:
    """As a suite is made: `bench_kernels.py` once per shard, `merge_bench.py` of the shards,
    then its plots (`kerneltune report`) and its table at a glance (`suite_summary.py`)."""
    from typer.testing import CliRunner

    from kerneltune.cli import app

    suite = ["--kernels", "rmsnorm_fwd,rmsnorm_quant_fwd", "--quant", "int8", "--m", "2,5",
             "--n", "64", "--peers", "torch-eager"]
    for i in range(2):
        run("bench_kernels.py", *suite, "--shard", f"{i}/2", "--out", f"shard-{i}.json",
            cwd=tmp_path)
    printed = run("merge_bench.py", "shard-0.json", "shard-1.json", "--out", "suite.json",
                  cwd=tmp_path)
    assert printed.startswith("suite.json: 8 rows from 2 results")
    merged = json.loads((tmp_path / "suite.json").read_text())
    assert [p["source"] for p in merged["processes"]] == ["shard-0.json", "shard-1.json"]
    sources: dict[tuple, set[str]] = defaultdict(set)
    for row in merged["rows"]:
        sources[(row["kernel"], row["m"])].add(row["source"])
    assert sorted(sources) == [("rmsnorm_fwd", 2), ("rmsnorm_fwd", 5),
                               ("rmsnorm_quant_fwd", 2), ("rmsnorm_quant_fwd", 5)]
    assert all(len(s) == 1 for s in sources.values())  # each shape from one process
    assert set().union(*sources.values()) == {"shard-0.json", "shard-1.json"}

    report = CliRunner().invoke(app, ["report", "--bench", str(tmp_path / "suite.json"),
                                      "--out", str(tmp_path / "report")])
    assert report.exit_code == 0, report.output
    assert sorted(p.name for p in (tmp_path / "report").glob("*.png")) == [
        "rmsnorm_fwd.png", "rmsnorm_quant_fwd-int8.png"]
    table = run("suite_summary.py", "suite.json", cwd=tmp_path)
    assert "| `rms_norm` forward | 2 of 2 | - | - |" in table  # no copy bandwidth on a CPU
    assert "| `rms_norm_quant` int8 | 2 of 2 |" in table


RESULTS = ROOT / "benchmarks" / "results"
#: Each committed suite, by its GPU's folder.
SUITES = {"nvidia-h100-80gb-hbm3": "NVIDIA H100 80GB HBM3", "nvidia-h200": "NVIDIA H200"}


@pytest.mark.parametrize("folder", sorted(SUITES))
def test_a_committed_suite_covers_the_suite_each_shape_from_one_process(folder) -> None:
    from bench_kernels import SUITE_M, SUITE_N, shape_key, suite_shapes

    result = json.loads((RESULTS / folder / "suite.json").read_text())
    assert result["device"] == SUITES[folder] and result["env"]["triton"]
    sources: dict[tuple, set[str]] = defaultdict(set)
    for row in result["rows"]:
        sources[shape_key(row["kernel"], row["options"], row["m"], row["n"])].add(row["source"])
    assert all(len(s) == 1 for s in sources.values())
    kernels = ["rmsnorm_fwd", "rmsnorm_bwd", "add_rmsnorm_fwd", "rmsnorm_quant_fwd"]
    suite = suite_shapes(kernels, ["int8", "fp8"], SUITE_M, SUITE_N, "bfloat16")
    # every shape of the suite, and any measured beside it (new kernels, shapes off the table)
    assert set(sources) >= {shape_key(*shape) for shape in suite}


def test_the_h100_suite_took_each_shard_on_its_own_gpu_of_one_host() -> None:
    result = json.loads((RESULTS / "nvidia-h100-80gb-hbm3" / "suite.json").read_text())
    shards = [p for p in result["processes"] if p["shard"]]
    assert sorted({p["source"].rsplit(":", 1)[-1] for p in shards}) == [
        f"shard-{i}.json" for i in range(4)]
    for process in shards:
        assert process["shard"] == f"{process['source'][-6]}/4"
    assert len({p["gpu_uuid"] for p in shards}) == 4
    # what was measured beside the suite since, each in one process of its own
    assert [p["source"] for p in result["processes"] if not p["shard"]] == [
        "out/new-kernels.json", "out/off-table.json", "out/layernorm-bwd-split.json",
        "out/layernorm-bwd-split-16k.json", "out/layernorm-fwd.json", "out/off-table-2.json",
        "out/quant-5376.json"]
