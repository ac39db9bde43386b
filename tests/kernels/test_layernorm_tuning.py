"""LayerNorm, registered through its entry point, goes the built-in kernels' way: `kerneltune
tune` searches and stores it (under the interpreter, on a tiny shape), `export --current` keeps
it, the service answers it from the store and the runtime resolves it exactly."""

from __future__ import annotations

from fastapi.testclient import TestClient
from typer.testing import CliRunner

from kerneltune import runtime, table
from kerneltune.api.app import create_app
from kerneltune.api.settings import Settings
from kerneltune.cli import app
from kerneltune.kernels.layernorm_spec import BWD, FWD
from kerneltune.table import INTERPRETER_DEVICE

runner = CliRunner()


def test_layernorm_is_tuned_stored_served_and_resolved_as_a_built_in(tmp_path, sqlite_url):
    result = runner.invoke(app, ["tune", "-k", "layernorm_fwd", "-k", "layernorm_bwd", "-d",
                                 "float32", "-n", "16", "-m", "1", "--trials", "2",
                                 "--retime-rounds", "1", "--no-progress", "--db", sqlite_url])
    assert result.exit_code == 0, result.output
    assert "layernorm_fwd fp32 n=16 m=1" in result.output
    assert "2 tuned, 0 already done, 0 failed, 0 incomplete" in result.output

    out = tmp_path / "table.json"
    result = runner.invoke(app, ["export", "--device", INTERPRETER_DEVICE, "--current", "-o",
                                 str(out), "--db", sqlite_url])
    assert result.exit_code == 0, result.output
    entries = {e.kernel: e for e in table.load(out).entries}
    assert sorted(entries) == ["layernorm_bwd", "layernorm_fwd"]
    for spec in (FWD, BWD):
        e = entries[spec.name]
        assert (e.dtype, e.n, e.m, e.trials) == ("float32", 16, 1, 2)
        assert e.kernel_hash == spec.kernel_hash and e.us > 0
        assert spec.rejects(spec.problem(1, 16, "float32"), spec.parse(
            spec.problem(1, 16, "float32"), e.config)) is None

    with TestClient(create_app(Settings(database_url=sqlite_url))) as client:
        kernels = {k["name"] for k in client.get("/api/v1/kernels").json()}
        assert {"layernorm_fwd", "layernorm_bwd"} <= kernels
        answer = client.get("/api/v1/configs/layernorm_fwd", params={
            "gpu": INTERPRETER_DEVICE, "n": 16, "m": 1, "dtype": "float32"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["match"] == "exact"
        assert answer.json()["config"] == entries["layernorm_fwd"].config

    # The job wrote this machine's own table, which the runtime reads first here.
    runtime.reset()
    try:
        for spec in (FWD, BWD):
            found = runtime.explain(spec.name, (1, 16, "float32"))
            assert found.match == "exact", found
            assert found.config.to_json() == entries[spec.name].config
    finally:
        runtime.reset()
