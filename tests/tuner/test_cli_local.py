"""What is tuned, and the shapes a model runs, reach the runtime: tune, import and merge refresh
the machine's own table, which a fresh process then reads with no setting; `misses` lists the
keys met untuned and `tune --from-misses` tunes them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from kerneltune import runtime, table
from kerneltune.cli import app
from kerneltune.kernels import REGISTRY
from kerneltune.runtime import local, record
from kerneltune.table import INTERPRETER_DEVICE, Entry, Table

runner = CliRunner()
GPU = "NVIDIA Test GPU 80GB"
TUNE = ["tune", "-k", "rmsnorm_fwd", "-d", "float32", "--trials", "2", "--retime-rounds", "1",
        "--no-progress"]
EXPLAIN = ("import kerneltune; r = kerneltune.explain('rms_norm', ({m}, 16, 'float32')); "
           "print(r.source, r.match, r.origin)")


def without_settings(**extra: str) -> dict[str, str]:
    """The environment with no KERNELTUNE_* setting (nor XDG_DATA_HOME), plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KERNELTUNE_") and k != "XDG_DATA_HOME"}
    return {**env, **extra}


def test_a_tune_job_resolves_exactly_in_a_fresh_process_with_no_setting(tmp_path):
    """The README's main job, then a new process: its key is the local table's, exactly."""
    env = without_settings(HOME=str(tmp_path / "home"), TRITON_INTERPRET="1")
    db = f"sqlite:///{tmp_path / 'store.db'}"
    done = subprocess.run([sys.executable, "-m", "kerneltune.cli", *TUNE, "-n", "16", "-m", "16",
                           "--db", db], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    path = (tmp_path / "home" / ".local" / "share" / "kerneltune" / "tables"
            / "triton-interpreter-cpu.json")
    assert f"local table {path}: 1 entries written" in done.stderr
    (tuned,) = table.load(path).entries
    assert (tuned.kernel, tuned.n, tuned.m, tuned.kernel_hash) == (
        "rmsnorm_fwd", 16, 16, REGISTRY["rmsnorm_fwd"].kernel_hash)

    env.pop("TRITON_INTERPRET")  # a CPU machine runs the interpreter's table all the same
    fresh = subprocess.run([sys.executable, "-c", EXPLAIN.format(m=13)], env=env,
                           capture_output=True, text=True, check=True, timeout=120)
    assert fresh.stdout.split() == ["local", "exact", str(path)]
    assert not (tmp_path / "home" / ".local" / "share" / "kerneltune" / "misses").exists()


RECORD = """
import torch, kerneltune
w = torch.randn(16)
for m in (3, 5, 6, 7):
    kerneltune.rms_norm(torch.randn(m, 16), w)
"""


def test_recorded_misses_are_listed_then_tuned_then_resolve_exactly(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    subprocess.run([sys.executable, "-c", RECORD], env=env, check=True, timeout=120)
    listed = runner.invoke(app, ["misses", "--json"])
    assert listed.exit_code == 0, listed.output
    doc = json.loads(listed.output)
    assert doc["device"] == INTERPRETER_DEVICE
    # each key once, at the row count it was resolved at (the first of its bucket)
    assert {(k["n"], k["m"]): k["rows"] for k in doc["keys"]} == {(16, 4): [3], (16, 8): [5]}
    assert all((k["processes"], k["match"]) == (1, "default") for k in doc["keys"])
    shown = runner.invoke(app, ["misses"]).output
    assert "rmsnorm_fwd" in shown and "default (default)" in shown

    db = f"sqlite:///{tmp_path / 'store.db'}"
    tuned = runner.invoke(app, ["tune", "--from-misses", "--trials", "2", "--retime-rounds", "1",
                                "--no-progress", "--db", db])
    assert tuned.exit_code == 0, tuned.output
    held = table.load(local.table_path(INTERPRETER_DEVICE))
    assert sorted((e.kernel, e.dtype, e.n, e.m) for e in held.entries) == [
        ("rmsnorm_fwd", "float32", 16, 4), ("rmsnorm_fwd", "float32", 16, 8)]
    assert not record.read(local.misses_path(INTERPRETER_DEVICE), INTERPRETER_DEVICE).keys
    assert "no untuned keys recorded" in runner.invoke(app, ["misses"]).output

    runtime.reset()
    for m in (3, 7):
        r = runtime.explain("rms_norm", (m, 16, "float32"))
        assert (r.source, r.match) == ("local", "exact")
    again = runner.invoke(app, ["tune", "--from-misses", "--db", db])
    assert again.exit_code == 0 and "nothing to tune" in again.output
    runtime.reset()


def current_table(device: str, ms: tuple[int, ...], us: float) -> Table:
    spec = REGISTRY["rmsnorm_fwd"]
    entries = [Entry(kernel="rmsnorm_fwd", dtype="bfloat16", n=4096, m=m,
                     config=spec.default(spec.problem(m, 4096, "bfloat16")).to_json(),
                     us=us * m, gbps=100.0, default_us=us * m, trials=1,
                     kernel_hash=spec.kernel_hash)
               for m in ms]
    return Table(device, entries=entries)


def test_import_and_merge_refresh_the_local_tables_which_are_listed_and_removed(
        tmp_path, monkeypatch):
    source_db, target_db = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    first = table.save(current_table(GPU, (1, 2), 5.0), tmp_path / "first.json")
    result = runner.invoke(app, ["import", str(first), "--db", source_db])
    assert result.exit_code == 0, result.output
    path = local.table_path(GPU)
    assert table.load(path).index() == current_table(GPU, (1, 2), 5.0).index()

    # a faster result for one key and a new key: the store's picks replace the local ones
    second = table.save(current_table(GPU, (2, 4), 1.0), tmp_path / "second.json")
    assert runner.invoke(app, ["import", str(second), "--db", source_db]).exit_code == 0
    assert {e.m: e.us for e in table.load(path).entries} == {1: 5.0, 2: 2.0, 4: 4.0}

    # a merge into another store, with another data directory: its table is brought in too
    other = tmp_path / "other-data"
    monkeypatch.setenv(local.ENV_DATA_DIR, str(other))
    result = runner.invoke(app, ["merge", source_db.removeprefix("sqlite:///"),
                                 "--db", target_db])
    assert result.exit_code == 0, result.output
    assert {e.m for e in table.load(local.table_path(GPU)).entries} == {1, 2, 4}
    listed = runner.invoke(app, ["tables"])
    assert listed.exit_code == 0
    (row,) = [line for line in listed.output.splitlines() if GPU in line]
    cells = [cell.strip() for cell in row.split("│") if cell.strip()]
    assert cells == [GPU, str(local.table_path(GPU)), "3", "3"]

    removed = runner.invoke(app, ["tables", "--remove", GPU])
    assert removed.exit_code == 0 and not local.table_path(GPU).exists()
    assert runner.invoke(app, ["tables", "--remove", GPU]).exit_code == 1
    assert "no local tables" in runner.invoke(app, ["tables"]).output
    assert Path(path).exists()  # the first data directory's is its own


def test_a_data_directory_that_cannot_be_written_fails_no_import(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(local.ENV_DATA_DIR, str(tmp_path / "a-file" / "data"))
    path = table.save(current_table(GPU, (1,), 5.0), tmp_path / "t.json")
    result = runner.invoke(app, ["import", str(path), "--db", f"sqlite:///{tmp_path / 'a.db'}"])
    assert result.exit_code == 0, result.output
    assert "1 of 1 entries stored" in result.output
    assert "local table not refreshed" in result.output
