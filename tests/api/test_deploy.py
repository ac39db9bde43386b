"""The deployment: docker-compose.yml as docker-compose reads it, and the commands it runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kerneltune.storage import is_migrated, make_engine

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = shutil.which("docker-compose")


def compose_config(*args: str, **env: str) -> dict:
    if COMPOSE is None:
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("KERNELTUNE_", "POSTGRES_", "COMPOSE_"))}
    result = subprocess.run(
        [COMPOSE, "-f", str(ROOT / "docker-compose.yml"), *args, "config"],
        capture_output=True, text=True, env={**clean, **env}, cwd=ROOT, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_compose_services_and_their_order():
    services = compose_config()["services"]
    # `up` without a profile starts these; the tuner needs the gpu profile (and a GPU).
    assert {name for name, s in services.items() if not s.get("profiles")} == {
        "db", "migrate", "api"
    }
    assert services["tuner"]["profiles"] == ["gpu"]
    db, migrate, api = services["db"], services["migrate"], services["api"]
    assert db["image"] == "postgres:16" and "healthcheck" in db
    assert any("/var/lib/postgresql/data" in str(v) for v in db["volumes"])
    assert migrate["depends_on"]["db"]["condition"] == "service_healthy"
    assert api["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert api["environment"]["KERNELTUNE_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert "0.0.0.0" in api["command"] and "serve" in api["command"]
    for service in (migrate, api):
        assert (ROOT / service["build"]["dockerfile"]).is_file()


def test_compose_takes_the_token_from_the_environment():
    api = compose_config(KERNELTUNE_WRITE_TOKEN="s3cret")["services"]["api"]
    assert api["environment"]["KERNELTUNE_WRITE_TOKEN"] == "s3cret"


def test_compose_gpu_profile_adds_the_tuner():
    services = compose_config("--profile", "gpu")["services"]
    tuner = services["tuner"]
    devices = tuner["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert tuner["command"][0] == "tune" and "--workers" in tuner["command"]
    assert tuner["environment"]["KERNELTUNE_DATABASE_URL"] == (
        services["api"]["environment"]["KERNELTUNE_DATABASE_URL"]
    )
    assert (ROOT / tuner["build"]["dockerfile"]).is_file()


def test_the_migrate_command_migrates(tmp_path):
    """The migrate service's command, run here against an SQLite file."""
    command = compose_config()["services"]["migrate"]["command"]
    assert command[0] == "python"
    url = f"sqlite:///{tmp_path / 'store.db'}"
    env = {**os.environ, "KERNELTUNE_DATABASE_URL": url}
    subprocess.run([sys.executable, *command[1:]], env=env, check=True, timeout=120)
    engine = make_engine(url)
    try:
        assert is_migrated(engine)
    finally:
        engine.dispose()


def test_the_commands_take_the_options_compose_gives():
    services = compose_config("--profile", "gpu")["services"]
    for service, sub in ((services["api"], "serve"), (services["tuner"], "tune")):
        args = service["command"]
        options = [a for a in args[args.index(sub) + 1:] if a.startswith("--")]
        help_text = subprocess.run(
            [sys.executable, "-m", "kerneltune.cli", sub, "--help"], capture_output=True,
            text=True, check=True, timeout=120, env={**os.environ, "COLUMNS": "200"},
        ).stdout
        for option in options:
            assert option in help_text, (sub, option)
