"""The `kerneltune` command: a light --help, tune, export and import against real stores."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from tests.runtime_table import runtime_on_table
from typer.testing import CliRunner

import kerneltune
from kerneltune import table
from kerneltune.cli import app
from kerneltune.kernels import REGISTRY, get_spec
from kerneltune.table import INTERPRETER_DEVICE, Entry, Env, Table, shipped_tables_dir

runner = CliRunner()
HEAVY = ("optuna", "sqlalchemy", "fastapi", "uvicorn", "torch", "alembic")


def test_help_lists_the_commands_without_heavy_imports():
    probe = ("import sys, kerneltune.cli; "
             f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("tune", "export", "import", "merge", "serve"):
        assert command in result.output


def test_list_presets():
    result = runner.invoke(app, ["tune", "--list-presets"])
    assert result.exit_code == 0
    lines = {line.split()[0]: line.split()[1:] for line in result.output.splitlines()}
    assert lines["llama3-8b"] == ["4096", "14336"]
    assert "16384" in lines["common"]


@pytest.mark.parametrize(("args", "message"), [
    (["tune", "-k", "rmsnorm_fwd"], "hidden size"),
    (["tune", "--n", "64", "--sampler", "grid"], "sampler"),
    (["tune", "--n", "64", "-k", "no_such_kernel"], "unknown kernel"),
    (["tune", "--n", "64", "--seed-table", "no/such/table.json"], "No such file"),
])
def test_tune_refuses_bad_jobs(args, message, sqlite_url):
    result = runner.invoke(app, [*args, "--db", sqlite_url])
    assert result.exit_code == 2
    assert message in result.output


def test_tune_of_listed_keys_tunes_those_alone(tmp_path, sqlite_url):
    listed = tmp_path / "keys.json"
    listed.write_text('[{"kernel": "rmsnorm_fwd", "dtype": "float32", "n": 16, "m": 1}, '
                      '{"kernel": "rmsnorm_fwd", "dtype": "float32", "n": 48, "m": 3}]')
    result = runner.invoke(app, ["tune", "--keys", str(listed), "--trials", "1",
                                 "--retime-rounds", "1", "--no-progress", "--db", sqlite_url])
    assert result.exit_code == 0, result.output
    assert "2 tuned, 0 already done" in result.output
    out = tmp_path / "interp.json"
    result = runner.invoke(app, ["export", "--device", INTERPRETER_DEVICE, "-o", str(out),
                                 "--db", sqlite_url])
    assert result.exit_code == 0, result.output
    # Not the product of the two sizes and the two buckets: the two keys listed.
    assert sorted((e.n, e.m) for e in table.load(out).entries) == [(16, 1), (48, 4)]


@pytest.mark.parametrize(("extra", "text", "message"), [
    (["-k", "rmsnorm_fwd"], '[{"kernel": "rmsnorm_fwd", "n": 16, "m": 1}]', "without -k"),
    ([], '[{"kernel": "rmsnorm_fwd", "n": 16}]', "'n': 16"),
    ([], '[{"kernel": "no_such_kernel", "n": 16, "m": 1}]', "unknown kernel"),
    ([], '[{"kernel": "rmsnorm_fwd", "n": 16, "m": 1, "dtype": "int8"}]', "dtypes must be"),
])
def test_tune_refuses_a_bad_key_list(extra, text, message, tmp_path, sqlite_url):
    listed = tmp_path / "keys.json"
    listed.write_text(text)
    result = runner.invoke(app, ["tune", "--keys", str(listed), *extra, "--db", sqlite_url])
    assert result.exit_code == 2
    assert message in result.output


def make_table(device: str, us: float) -> Table:
    """Entries of other kernel code than the running one, each config one the kernel takes at
    its key (the heuristic's, as an older entry stored it: without the parameters added
    since)."""
    spec = REGISTRY["rmsnorm_fwd"]
    added = spec.config_type.added_since()

    def config(n: int, m: int) -> dict:
        full = spec.default(spec.problem(m, n, "bfloat16")).to_json()
        return {k: v for k, v in full.items() if k not in added}

    entries = [
        Entry(kernel="rmsnorm_fwd", dtype="bfloat16", n=n, m=m, config=config(n, m),
              us=us * m / 64, gbps=2 * m * n * 2 / (us * m / 64 * 1e3),
              default_us=us * m / 64 * 1.1, trials=40, kernel_hash="0123456789abcdef",
              frac_copy=0.8, env=Env(triton="3.6.0", torch="2.11.0"))
        for n in (4096, 8192) for m in (64, 1024)
    ]
    return Table(device, Env(triton="3.6.0", torch="2.11.0", cuda="13.0", driver="580.1"),
                 copy_gbps=3010.0, entries=entries)


def test_import_then_export_gives_the_table_back(tmp_path, sqlite_url):
    original = make_table("NVIDIA Test GPU", us=10.0)
    path = table.save(original, tmp_path / "in.json")
    result = runner.invoke(app, ["import", str(path), "--db", sqlite_url])
    assert result.exit_code == 0, result.output
    assert "4 of 4 entries stored" in result.output

    out = tmp_path / "out.json"
    result = runner.invoke(app, ["export", "--device", "NVIDIA Test GPU", "-o", str(out),
                                 "--db", sqlite_url])
    assert result.exit_code == 0, result.output
    assert table.load(out) == original.sorted()

    # a slower table changes nothing; a faster one replaces every entry
    slower = table.save(make_table("NVIDIA Test GPU", us=20.0), tmp_path / "slow.json")
    faster = table.save(make_table("NVIDIA Test GPU", us=5.0), tmp_path / "fast.json")
    result = runner.invoke(app, ["import", str(slower), str(faster), "--db", sqlite_url])
    assert result.exit_code == 0, result.output
    assert "0 of 4" in result.output and "4 of 4" in result.output
    result = runner.invoke(app, ["export", "--device", "NVIDIA Test GPU", "--db", sqlite_url])
    assert table.loads(result.stdout) == make_table("NVIDIA Test GPU", us=5.0).sorted()


def test_import_refuses_a_bad_file_and_stores_nothing(tmp_path, sqlite_url):
    good = table.save(make_table("NVIDIA Test GPU", us=10.0), tmp_path / "good.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": 1, "device": "x", "entries": [{"kernel": "k"}]}')
    result = runner.invoke(app, ["import", str(good), str(bad), "--db", sqlite_url])
    assert result.exit_code == 1
    assert "bad.json" in result.output
    result = runner.invoke(app, ["export", "--device", "NVIDIA Test GPU", "--db", sqlite_url])
    assert result.exit_code == 1
    assert "no results" in result.output


def test_import_lists_refused_entries_and_stores_nothing(tmp_path, sqlite_url):
    """An entry whose config its kernel refuses at its key, or of a kernel this code does not
    know: each listed with its file, index, key and why; nothing is imported (not even the
    valid entries, nor the other files), exit status 1."""
    good = make_table("NVIDIA Test GPU", us=10.0)
    first = good.entries[0]
    refused = replace(good, entries=[
        first,
        replace(good.entries[1], config={**first.config, "ROWS": 0}),
        replace(good.entries[2], kernel="no_such_kernel"),
    ])
    ok = table.save(make_table("NVIDIA Other GPU", us=10.0), tmp_path / "ok.json")
    bad = table.save(refused, tmp_path / "bad.json")
    result = runner.invoke(app, ["import", str(ok), str(bad), "--db", sqlite_url])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()  # entries as the file holds them (sorted)
    assert lines[0].startswith(f"{bad}: entries[0] (no_such_kernel bfloat16 n=8192 m=64): ")
    assert lines[1].startswith(f"{bad}: entries[2] (rmsnorm_fwd bfloat16 n=4096 m=1024): ")
    assert "ROWS=0" in lines[1]
    assert lines[2:] == ["2 entries refused; nothing imported"]
    for device in ("NVIDIA Test GPU", "NVIDIA Other GPU"):
        result = runner.invoke(app, ["export", "--device", device, "--db", sqlite_url])
        assert result.exit_code == 1 and "no results" in result.output
    help_text = " ".join(runner.invoke(app, ["import", "--help"]).output.split())
    assert "All or nothing" in help_text and "nothing is stored" in help_text


def test_tune_then_export(tmp_path, sqlite_url):
    result = runner.invoke(app, ["tune", "-k", "rmsnorm_fwd", "-d", "float32", "-n", "16",
                                 "-m", "1", "--trials", "2", "--retime-rounds", "1",
                                 "--no-progress", "--db", sqlite_url])
    assert result.exit_code == 0, result.output
    assert "rmsnorm_fwd fp32 n=16 m=1" in result.output
    assert "1 tuned, 0 already done, 0 failed, 0 incomplete" in result.output

    out = tmp_path / "interp.json"
    result = runner.invoke(app, ["export", "--device", INTERPRETER_DEVICE, "-o", str(out),
                                 "--db", sqlite_url])
    assert result.exit_code == 0, result.output
    exported = table.load(out)
    (entry,) = exported.entries
    assert (entry.kernel, entry.dtype, entry.n, entry.m) == ("rmsnorm_fwd", "float32", 16, 1)
    assert entry.trials == 2 and entry.us > 0

    # the same command again: nothing left to do
    result = runner.invoke(app, ["tune", "-k", "rmsnorm_fwd", "-d", "float32", "-n", "16",
                                 "-m", "1", "--trials", "2", "--no-progress", "--db", sqlite_url])
    assert result.exit_code == 0, result.output
    assert "0 tuned, 1 already done" in result.output

    # --json: the report as one JSON line on stdout, the stored entry as the table holds it
    result = runner.invoke(app, ["tune", "-k", "rmsnorm_fwd", "-d", "float32", "-n", "16",
                                 "-m", "1", "--trials", "2", "--no-progress", "--json",
                                 "--db", sqlite_url])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["device"], report["status"]) == (INTERPRETER_DEVICE, "done")
    (key,) = report["keys"]
    assert (key["kernel"], key["dtype"], key["n"], key["m"], key["status"]) == (
        "rmsnorm_fwd", "float32", 16, 1, "done")
    assert key["entry"] == table.table_to_dict(exported)["entries"][0]


def test_export_current_leaves_out_entries_tuned_on_other_kernel_code(tmp_path, sqlite_url):
    result = runner.invoke(app, ["tune", "-k", "rmsnorm_fwd", "-d", "float32", "-n", "16",
                                 "-m", "1", "--trials", "1", "--retime-rounds", "1",
                                 "--no-progress", "--db", sqlite_url])
    assert result.exit_code == 0, result.output
    stale = make_table(INTERPRETER_DEVICE, us=10.0)  # kernel hash 0123456789abcdef
    result = runner.invoke(app, ["import", str(table.save(stale, tmp_path / "stale.json")),
                                 "--db", sqlite_url])
    assert result.exit_code == 0, result.output

    args = ["export", "--device", INTERPRETER_DEVICE, "--db", sqlite_url]
    everything = table.loads(runner.invoke(app, args).stdout)
    assert len(everything.entries) == 5
    current = table.loads(runner.invoke(app, [*args, "--current"]).stdout)
    assert [(e.kernel, e.n, e.m) for e in current.entries] == [("rmsnorm_fwd", 16, 1)]
    assert current.entries[0].kernel_hash == REGISTRY["rmsnorm_fwd"].kernel_hash
    assert current.copy_gbps == everything.copy_gbps


def test_import_never_replaces_a_result_of_the_running_code_with_a_stale_one(tmp_path,
                                                                             sqlite_url):
    result = runner.invoke(app, ["tune", "-k", "rmsnorm_fwd", "-d", "float32", "-n", "16",
                                 "-m", "1", "--trials", "1", "--retime-rounds", "1",
                                 "--no-progress", "--db", sqlite_url])
    assert result.exit_code == 0, result.output
    args = ["export", "--device", INTERPRETER_DEVICE, "--db", sqlite_url]
    (tuned,) = table.loads(runner.invoke(app, args).stdout).entries
    # The same key from an older table: far faster, measured on other kernel code.
    older = replace(tuned, us=tuned.us / 1000, kernel_hash="0123456789abcdef")
    path = table.save(Table(INTERPRETER_DEVICE, Env(), entries=[older]), tmp_path / "old.json")
    result = runner.invoke(app, ["import", str(path), "--db", sqlite_url])
    assert result.exit_code == 0, result.output
    assert "0 of 1 entries stored" in result.output
    assert table.loads(runner.invoke(app, args).stdout).entries == [tuned]


def closed_port() -> int:
    """A loopback TCP port nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("command", [
    ["tune", "-k", "rmsnorm_fwd", "-d", "float32", "-n", "16", "-m", "1", "--trials", "1",
     "--no-progress", "--db"],
    ["export", "--device", "NVIDIA Test GPU", "--db"],
    ["import", "TABLE", "--db"],
    ["merge", "SOURCE", "--db"],
    ["serve", "--database-url"],
])
def test_a_store_that_cannot_be_reached_is_one_line_naming_it(command, tmp_path):
    path = table.save(make_table("NVIDIA Test GPU", us=10.0), tmp_path / "t.json")
    source = tmp_path / "source.db"
    runner.invoke(app, ["import", str(path), "--db", f"sqlite:///{source}"])
    args = [{"TABLE": str(path), "SOURCE": str(source)}.get(a, a) for a in command]
    url = f"postgresql://tuner:s3cret@127.0.0.1:{closed_port()}/store"
    result = runner.invoke(app, [*args, url])
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert line.startswith("store ") and "tuner:***@127.0.0.1" in line
    assert "Connection refused" in line and "s3cret" not in line


@pytest.mark.parametrize(("url", "reason"), [
    ("sqlite:///{tmp}/a-file/store.db", "unable to open database file"),  # its folder is a file
    ("nosuchdb://host/store", "unsupported database 'nosuchdb'"),
])
def test_a_store_that_cannot_be_opened_is_one_line(url, reason, tmp_path):
    (tmp_path / "a-file").write_text("")
    result = runner.invoke(app, ["export", "--device", "NVIDIA Test GPU", "--db",
                                 url.format(tmp=tmp_path)])
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert line.startswith("store ") and reason in line


#: The extras' modules (pyproject.toml): what a base install (torch, triton, typer, rich) lacks.
EXTRA_MODULES = ("optuna", "sqlalchemy", "alembic", "psycopg", "fastapi", "uvicorn",
                 "pydantic_settings", "starlette", "matplotlib", "httpx")

#: Runs the command line with the extras' modules unimportable, as on a base install.
BASE_INSTALL = f"""
import sys
from importlib.abc import MetaPathFinder

class Absent(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {EXTRA_MODULES!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

sys.meta_path.insert(0, Absent())
from kerneltune.cli import app
app(sys.argv[1:], prog_name="kerneltune")
"""


def run_base_install(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BASE_INSTALL, *args], capture_output=True,
                          text=True, timeout=120)


def test_help_works_on_the_base_install():
    out = run_base_install("--help")
    assert out.returncode == 0, out.stderr
    for command in ("tune", "export", "serve", "bench", "report"):
        assert command in out.stdout


@pytest.mark.parametrize(("args", "module", "extra"), [
    (["serve"], "fastapi", "serve"),
    (["tune", "-n", "64"], "optuna", "tune"),
    (["export", "-o", "table.json"], "sqlalchemy", "tune"),
])
def test_a_command_of_an_extra_names_it_in_one_line(args, module, extra):
    out = run_base_install(*args)
    assert out.returncode == 1
    assert out.stderr.strip() == (f"`kerneltune {args[0]}` needs {module}, which is not "
                                  f"installed: pip install 'kerneltune[{extra}]'")


def test_version():

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"kerneltune {kerneltune.__version__}\n"


def explain_table(path, gpu: str):
    """A table for `gpu` with one rmsnorm_fwd entry (n=64, m=4, float32) of another config than
    the default; that config."""
    spec = get_spec("rmsnorm_fwd")
    problem = spec.problem(4, 64, "float32")
    config = next(c for c in spec.configs(problem) if c != spec.default(problem))
    table.save(Table(device=gpu, entries=[Entry(
        kernel="rmsnorm_fwd", dtype="float32", n=64, m=4, config=config.to_json(), us=5.0,
        gbps=10.0, default_us=6.0, trials=3, kernel_hash=spec.kernel_hash)]), path)
    return config


def test_explain_prints_what_the_runtime_resolves(tmp_path):

    with runtime_on_table(tmp_path, "NVIDIA Test GPU") as path:
        kerneltune.runtime.reset()
        config = explain_table(path, "NVIDIA Test GPU")
        text = runner.invoke(app, ["explain", "rmsnorm_fwd", "-n", "64", "-m", "3",
                                   "--dtype", "float32"])
        assert text.exit_code == 0, text.output
        expected = kerneltune.explain("rmsnorm_fwd", (3, 64, "float32"))
        assert text.output == f"{expected}\n" and "exact match from table" in text.output
        out = runner.invoke(app, ["explain", "rmsnorm_fwd", "-n", "64", "-m", "3", "-d",
                                  "float32", "--json"])
        assert out.exit_code == 0, out.output
        found = json.loads(out.output)
        assert (found["source"], found["match"], found["m_bucket"]) == ("table", "exact", 4)
        assert found["config"] == config.to_json() and found["entry"]["us"] == 5.0
        bad = runner.invoke(app, ["explain", "no_such_kernel", "-n", "64", "-m", "3"])
        assert bad.exit_code == 2 and "no_such_kernel" in bad.output


def test_bench_json():

    result = runner.invoke(app, ["bench", "-k", "rmsnorm_fwd", "-n", "64", "-m", "1", "-m", "3",
                                 "-d", "float32", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [(r["n"], r["m"]) for r in rows] == [(64, 1), (64, 3)]
    for r in rows:
        assert r["us"] > 0 and r["speedup"] == pytest.approx(r["default_us"] / r["us"])
        assert r["config"]["BLOCK_N"] == 64
        assert r["method"] == "interpreter" or torch.cuda.is_available()


def test_report_of_a_shipped_table_writes_outside_the_package(tmp_path, monkeypatch):
    shipped = sorted(shipped_tables_dir().glob("*.json"))[0]
    before = sorted(p.name for p in shipped.parent.iterdir())
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["report", str(shipped)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "report" / "README.md").read_text().startswith("# kerneltune")
    assert sorted(p.name for p in shipped.parent.iterdir()) == before
