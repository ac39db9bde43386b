"""The benchmark scripts that need no GPU step, run as scripts on real data: the search study's
replay over measurements taken under the interpreter, the lane summary of a real two-lane
tuning job's store, and the training plot of committed GPU results."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kerneltune.tuner.job import Job
from kerneltune.tuner.runner import JobRunner

ROOT = Path(__file__).resolve().parents[2]


def script(name: str, *args: str) -> str:
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *args], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_search_study_replays_the_tuner_against_brute_force(tmp_path):
    keys = ["rmsnorm_fwd:200:8:float32", "add_rmsnorm_fwd:200:8:float32"]
    brute = tmp_path / "brute.json"
    script("search_study.py", "measure", "--keys", *keys, "--out", str(brute))
    measured = json.loads(brute.read_text())
    assert list(measured["keys"]) == keys
    for data in measured["keys"].values():
        times = [r["us"] for r in data["configs"].values()]
        assert data["best_us"] == min(times) and len(times) >= 20

    study_path = tmp_path / "study.json"
    script("search_study.py", "replay", str(brute), "--seeds", "0,1,2", "--batch", "4",
           "--out", str(study_path))
    study = json.loads(study_path.read_text())
    assert study_path.with_suffix(".png").stat().st_size > 0
    for key in keys:
        result = study["keys"][key]
        assert [r["seed"] for r in result["runs"]] == [0, 1, 2]
        for run in result["runs"]:
            ratios = [ratio for ratio, _ in run["curve"]]
            assert ratios == sorted(ratios, reverse=True)  # best so far never gets worse
            hit = run["trials_to_within"]
            assert hit is not None and ratios[hit - 1] <= 1.02
            assert all(r > 1.02 for r in ratios[: hit - 1])


def test_lanes_show_each_key_tuned_once_by_one_lane(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    job = Job(kernels=["rmsnorm_fwd"], ns=[48], dtypes=["float32"], m_buckets=[1, 2, 4, 8],
              trials=2, retime_rounds=1, retime_top=1)
    report = JobRunner(job, url, workers=2).run()
    assert report.status == "done"
    out = tmp_path / "lanes.json"
    script("lanes.py", url, "--out", str(out))
    summary = json.loads(out.read_text())
    assert sorted(k["key"] for k in summary["keys"]) == sorted(
        f"rmsnorm_fwd float32 n48 m{m}" for m in (1, 2, 4, 8))
    assert sum(summary["keys_per_lane"].values()) == 4
    assert set(summary["keys_per_lane"]) <= {"0 gpu interpreter", "1 gpu interpreter"}
    assert summary["keys_over_budget"] == []
    assert all(0 <= k["started"] <= k["ended"] <= summary["span_s"] for k in summary["keys"])
    assert out.with_suffix(".png").stat().st_size > 0


def _compile_env() -> dict[str, str]:
    """The environment of a script that compiles for a GPU (not under the interpreter)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    return env


def test_sass_mix_counts_instructions_per_element_offline():
    env = _compile_env()
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sass_mix.py"), "--kernels", "rmsnorm_fwd",
         "rmsnorm_quant_fwd", "rmsnorm_bwd", "--block", "1024", "--warps", "1", "2", "--n", "640",
         "1024"],
        env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    header, *lines = done.stdout.splitlines()
    assert header.startswith("sm_90 SASS from Triton ")
    per_element = {}
    for line in lines:
        name, _, rest = line.partition(" BLOCK_N=1024: ")
        per_element[name] = float(rest.split(" instructions per element")[0])
    # quantising costs instructions on top of the normalisation the forward does
    assert 0 < per_element["rmsnorm_fwd"] < per_element["rmsnorm_quant_fwd"]
    # the backward (its kernel typed as it is launched) reads two tensors and sums dw as well
    assert per_element["rmsnorm_fwd"] < per_element["rmsnorm_bwd"]
    refused = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sass_mix.py")],
                             env={**env, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
                             check=False)
    assert refused.returncode != 0 and "unset TRITON_INTERPRET" in refused.stderr


def _sass_mix_prints(code: str) -> str:
    """What `code` prints, run with `benchmarks/` importable in a process that compiles for a
    GPU (`sass_mix` refuses the interpreter)."""
    script = "import sys; sys.path.insert(0, sys.argv[1])\n" + code
    done = subprocess.run([sys.executable, "-c", script, str(ROOT / "benchmarks")],
                          env=_compile_env(), capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_quant_int8_needs_no_conversion_or_clamp_instructions_offline():
    """int8 is stored as the low byte of a fused multiply-add, unclamped: the whole-row
    kernel's sm_90 SASS has no float -> int conversion, and fewer FMNMX than two an element
    (the row's max takes about one; each clamp took one more)."""
    printed = _sass_mix_prints("from sass_mix import sass_counts\n"
                               "c = sass_counts('rmsnorm_quant_fwd', 1024, 1)\n"
                               "print(c['F2I'], c['FMNMX'])")
    conversions, min_max = (int(v) for v in printed.split())
    elements = 1024 // 32  # per thread, one warp
    assert conversions == 0
    assert min_max < 2 * elements


@pytest.mark.parametrize("kernel", ["rmsnorm_fwd", "add_rmsnorm_fwd", "rmsnorm_quant_fwd",
                                    "rmsnorm_bwd"])
def test_whole_row_kernels_wait_before_any_access_and_release_after_their_loads_offline(kernel):
    """With PDL a whole-row kernel (sm_90 SASS) waits for the grid before it (ACQBULK) ahead of
    its first global load or store, and releases the next grid (PREEXIT) after its last load
    but ahead of its last store (y, q, or the backward's dw); without PDL it does neither."""
    printed = _sass_mix_prints(
        "from sass_mix import sass_opcodes\n"
        f"for pdl in (True, False): print(*sass_opcodes({kernel!r}, 1024, 2, PDL=pdl))")
    with_pdl, without = (line.split() for line in printed.splitlines())
    loads = [i for i, op in enumerate(with_pdl) if op == "LDG"]
    stores = [i for i, op in enumerate(with_pdl) if op == "STG"]
    assert with_pdl.count("ACQBULK") == 1 and with_pdl.count("PREEXIT") == 1
    assert with_pdl.index("ACQBULK") < min(loads + stores)
    assert max(loads) < with_pdl.index("PREEXIT") < max(stores)
    assert "ACQBULK" not in without and "PREEXIT" not in without
    assert "LDG" in without


def test_training_plot_draws_the_committed_results(tmp_path):
    results = ROOT / "benchmarks" / "results" / "nvidia-h100-80gb-hbm3" / "runtime-autograd"
    png = tmp_path / "training.png"
    script("bench_training.py", "--plot", str(results / "train-new.json"),
           str(results / "train-old.json"), "--out", str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_device_code_tells_a_docstring_edit_from_a_device_code_edit(tmp_path):
    """The fingerprint of a suite row's config stays when only a docstring of its kernel module
    changes (which changes the module's hash) and moves when its maths does."""
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps({"rows": [
        {"kernel": "rmsnorm_fwd", "m": 4096, "n": 4096, "dtype": "bfloat16", "options": {},
         "impl": "kerneltune", "gpu_us": 25.0, "source": "1-part.json"},
        {"kernel": "rmsnorm_fwd", "m": 4096, "n": 4096, "dtype": "bfloat16", "options": {},
         "impl": "liger", "gpu_us": 26.0, "source": "1-part.json"},
    ]}))
    module = Path("kerneltune/kernels/rmsnorm_fwd.py")
    trees = {}
    for name, edit in {
        "docstring": lambda text: text.replace('"""RMSNorm forward:', '"""RMSNorm, forward:', 1),
        "maths": lambda text: text.replace("/ N + eps)", "/ N + 2 * eps)"),
    }.items():
        tree = tmp_path / name
        shutil.copytree(ROOT / "src", tree, ignore=shutil.ignore_patterns("__pycache__"))
        before = (tree / module).read_text()
        (tree / module).write_text(edit(before))
        assert (tree / module).read_text() != before
        trees[name] = tree

    def prints(src: Path | None) -> dict[str, str]:
        out = tmp_path / f"{src.name if src else 'head'}.json"
        done = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "device_code.py"), str(suite), str(out),
             *(["--src", str(src)] if src else [])],
            env=_compile_env(), capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(out.read_text())

    head = prints(None)
    assert list(head) == ["rmsnorm_fwd 4096x4096 {} 1-part.json"]  # kerneltune's row alone
    assert prints(trees["docstring"]) == head
    assert prints(trees["maths"]) != head
    refused = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "device_code.py"),
                              str(suite), str(tmp_path / "x.json")],
                             env={**_compile_env(), "TRITON_INTERPRET": "1"},
                             capture_output=True, text=True, check=False)
    assert refused.returncode != 0 and "unset TRITON_INTERPRET" in refused.stderr


def test_device_code_gives_the_rows_dimensions_m_and_keeps_n_whatever_it_is(monkeypatch):
    """The launches are recorded on storage-less inputs of the problem's shapes: every row
    dimension is M, and the weight keeps N, even where N equals the few rows the inputs were
    first made for."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from device_code import _meta_inputs
    from kerneltune.kernels import REGISTRY

    for kernel in ("rmsnorm_fwd", "rmsnorm_bwd", "add_rmsnorm_fwd"):
        spec = REGISTRY[kernel]
        for n in (3, 4, 4096):
            inputs = _meta_inputs(spec, spec.problem(1000, n))
            assert inputs["x"].shape == (1000, n) and inputs["x"].device.type == "meta"
            assert inputs["weight"].shape == (n,), (kernel, n)


def test_the_suite_on_gpus_refuses_a_host_without_a_gpu(tmp_path):
    # PATH holds only the tools the script runs before it counts GPUs: no nvidia-smi.
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("dirname", "wc"):
        (tools / tool).symlink_to(shutil.which(tool))
    done = subprocess.run([shutil.which("bash"), str(ROOT / "benchmarks" / "suite_on_gpus.sh"),
                           str(tmp_path / "out"), "table.json", "1"],
                          env={"PATH": str(tools)}, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 1 and "no GPU found" in done.stderr
    assert not (tmp_path / "out").exists()
