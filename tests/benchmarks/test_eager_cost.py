"""`benchmarks/eager_cost.py` run as a script under the interpreter: every public function and
the training step are called, beside F.rms_norm, and written as rows with their ratios."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .script import ROOT, run_script


def test_eager_cost_times_each_public_function_beside_torch(tmp_path):
    out = tmp_path / "eager.json"
    run_script("eager_cost.py", "--out", str(out), "--calls", "2", "--label", "here")
    result = json.loads(out.read_text())
    assert result["label"] == "here"
    assert result["source"] == str(ROOT / "src" / "kerneltune")
    rows = {(r["mode"], r["fn"]): r for r in result["rows"]}
    assert set(rows) == {
        *(("inference", f) for f in ("F.rms_norm", "rms_norm", "add_rms_norm",
                                     "rms_norm_quant int8", "rms_norm_quant fp8",
                                     "F.layer_norm", "layer_norm", "rms_norm_group_quant fp8",
                                     "add_rms_norm_quant fp8")),
        *(("training", f) for f in ("F.rms_norm", "rms_norm", "F.layer_norm", "layer_norm"))}
    for r in rows.values():
        assert r["eager_us"] > 0
        base = rows[(r["mode"], "F.rms_norm")]["eager_us"]
        assert abs(r["ratio_to_F.rms_norm"] - r["eager_us"] / base) < 0.01 * r["eager_us"] / base


def test_every_entry_the_runtime_can_pick_at_small_m_is_timed_at_its_key(tmp_path, monkeypatch):
    from kerneltune import table as tbl
    from kerneltune.kernels import REGISTRY

    def entry(kernel: str, m: int) -> tbl.Entry:
        spec = REGISTRY[kernel]
        problem = spec.problem(m, 64, "bfloat16")
        config = next(c for c in spec.configs(problem) if c != spec.default(problem))
        return tbl.Entry(kernel, "bfloat16", n=64, m=m, config=config, us=1.0, gbps=1.0,
                         default_us=1.0, trials=1, kernel_hash=spec.kernel_hash)

    kernels = ["rmsnorm_fwd", "add_rmsnorm_fwd", "rmsnorm_quant_fwd", "rmsnorm_bwd",
               "layernorm_fwd", "layernorm_bwd", "rmsnorm_group_quant_fwd",
               "add_rmsnorm_group_quant_fwd"]
    entries = [entry(k, 2) for k in kernels] + [entry("rmsnorm_fwd", 128)]  # past --entries
    path = tbl.save(tbl.Table(tbl.INTERPRETER_DEVICE, entries=entries), tmp_path / "table.json")
    monkeypatch.setenv("KERNELTUNE_TABLE", str(path))
    out = tmp_path / "eager.json"
    done = run_script("eager_cost.py", "--out", str(out), "--calls", "2", "--entries", "64")
    timed = json.loads(out.read_text())["entries"]
    assert timed["max_m"] == 64 and timed["complete"] is True
    rows = {(r["kernel"], r["fn"]): r for r in timed["rows"]}
    assert set(rows) == {("rmsnorm_fwd", "rms_norm"), ("add_rmsnorm_fwd", "add_rms_norm"),
                         ("rmsnorm_quant_fwd", "rms_norm_quant int8"),
                         ("rmsnorm_quant_fwd", "rms_norm_quant fp8"),
                         ("rmsnorm_bwd", "rms_norm"), ("layernorm_fwd", "layer_norm"),
                         ("layernorm_bwd", "layer_norm"),
                         ("rmsnorm_group_quant_fwd", "rms_norm_group_quant fp8"),
                         ("add_rmsnorm_group_quant_fwd", "add_rms_norm_quant fp8")}
    for (kernel, _), r in rows.items():
        # each at its own key, where the runtime runs exactly that entry's config
        assert (r["m"], r["n"], r["match"], r["source"]) == (2, 64, "exact", "table"), r
        assert r["runs_entry"] and r["config"] == dict(entries[kernels.index(kernel)].config)
        assert r["eager_us"] > 0 and r["ratio_to_F.rms_norm"] > 0
    assert rows[("rmsnorm_bwd", "rms_norm")]["mode"] == "training"
    assert rows[("layernorm_bwd", "layer_norm")]["mode"] == "training"
    worst = timed["worst"]
    assert set(worst) == {f"{r['mode']} {r['fn']}" for r in timed["rows"]}
    assert worst["inference rms_norm_quant int8"] == rows[("rmsnorm_quant_fwd",
                                                          "rms_norm_quant int8")]
    assert "# training rms_norm: at most" in done.stdout


def test_a_run_stopped_among_the_entries_keeps_what_it_measured(tmp_path, monkeypatch):
    """The file is whole after every entry: stopped (as a time limit stops it) after the first,
    it holds the functions' rows and that entry's, marked incomplete."""
    from kerneltune import table as tbl
    from kerneltune.kernels import REGISTRY

    spec = REGISTRY["rmsnorm_fwd"]
    entries = [tbl.Entry("rmsnorm_fwd", "bfloat16", n=n, m=2,
                         config=spec.default(spec.problem(2, n, "bfloat16")), us=1.0, gbps=1.0,
                         default_us=1.0, trials=1, kernel_hash=spec.kernel_hash)
               for n in (64, 128, 256, 512, 1024, 2048)]
    path = tbl.save(tbl.Table(tbl.INTERPRETER_DEVICE, entries=entries), tmp_path / "table.json")
    env = {**os.environ, "KERNELTUNE_TABLE": str(path), "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "eager.json"
    run = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "eager_cost.py"), "--out",
                            str(out), "--calls", "2", "--entries", "64"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        for line in run.stdout:  # the first entry's row: its file is written before it goes on
            if '"runs_entry"' in line:
                break
        run.kill()
    finally:
        run.wait(timeout=60)
    partial = json.loads(out.read_text())
    assert {r["fn"] for r in partial["rows"]} >= {"F.rms_norm", "rms_norm", "layer_norm"}
    timed = partial["entries"]
    assert timed["complete"] is False and "worst" not in timed
    assert 1 <= len(timed["rows"]) < len(entries)
    assert timed["rows"][0]["n"] == 64 and timed["rows"][0]["runs_entry"]


def test_entries_without_a_table_stop_before_measuring(tmp_path, monkeypatch):
    monkeypatch.delenv("KERNELTUNE_TABLE", raising=False)
    monkeypatch.setenv("KERNELTUNE_DATA_DIR", str(tmp_path / "data"))  # no table of its own
    out = tmp_path / "eager.json"
    done = run_script("eager_cost.py", "--out", str(out), "--calls", "2", "--entries", "64",
                      check=False)
    assert done.returncode == 1 and "no tuned table for" in done.stderr, done.stderr
    assert "KERNELTUNE_TABLE" in done.stderr and not out.exists()
    assert "F.rms_norm" not in done.stdout  # nothing was timed first
