"""Service settings from the environment."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kerneltune.api.settings import Settings, settings_problem
from kerneltune.storage import default_database_url


def test_settings_from_the_environment(monkeypatch):
    monkeypatch.setenv("KERNELTUNE_DATABASE_URL", "postgresql+psycopg://u@h/db")
    monkeypatch.setenv("KERNELTUNE_WRITE_TOKEN", "s3cret-value-0123456")
    monkeypatch.setenv("KERNELTUNE_CORS_ORIGINS", "http://a.test, http://b.test")
    monkeypatch.setenv("KERNELTUNE_LOG_LEVEL", "WARNING")
    s = Settings(_env_file=None)
    assert s.database_url == "postgresql+psycopg://u@h/db"
    assert s.write_token is not None and s.write_token.get_secret_value() == "s3cret-value-0123456"
    assert "s3cret-value-0123456" not in repr(s)
    assert s.cors_origins == ["http://a.test", "http://b.test"]
    assert s.log_level == "warning"


def test_defaults(monkeypatch, tmp_path):
    for name in ("DATABASE_URL", "WRITE_TOKEN", "CORS_ORIGINS", "LOG_LEVEL"):
        monkeypatch.delenv(f"KERNELTUNE_{name}", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setenv("KERNELTUNE_WRITE_TOKEN", "")  # set but empty: writes stay disabled
    s = Settings(_env_file=None)
    assert s.database_url == default_database_url()
    assert str(tmp_path) in s.database_url
    assert s.write_token is None and s.cors_origins == [] and s.log_level == "info"
    assert s.max_body_bytes == 8 << 20
    assert (s.database_connect_timeout_s, s.database_statement_timeout_s) == (5.0, 15.0)
    assert s.ready_timeout_s == 2.0


@pytest.mark.parametrize("token", ["zq", "0123456789abcde"])
def test_a_write_token_shorter_than_16_characters_is_refused(monkeypatch, token):
    monkeypatch.setenv("KERNELTUNE_WRITE_TOKEN", token)
    with pytest.raises(ValidationError) as refused:
        Settings(_env_file=None)
    line = settings_problem(refused.value)
    assert line.startswith("KERNELTUNE_WRITE_TOKEN is") and "at least 16" in line
    assert token not in line.replace("KERNELTUNE_WRITE_TOKEN", "") and "\n" not in line
    monkeypatch.setenv("KERNELTUNE_WRITE_TOKEN", token + "x" * 16)
    assert Settings(_env_file=None).write_token is not None


def test_limits_and_timeouts_from_the_environment(monkeypatch):
    monkeypatch.setenv("KERNELTUNE_MAX_BODY_BYTES", "65536")
    monkeypatch.setenv("KERNELTUNE_DATABASE_CONNECT_TIMEOUT_S", "2.5")
    monkeypatch.setenv("KERNELTUNE_DATABASE_STATEMENT_TIMEOUT_S", "30")
    monkeypatch.setenv("KERNELTUNE_READY_TIMEOUT_S", "1")
    s = Settings(_env_file=None)
    assert (s.max_body_bytes, s.database_connect_timeout_s) == (65536, 2.5)
    assert (s.database_statement_timeout_s, s.ready_timeout_s) == (30.0, 1.0)
    monkeypatch.setenv("KERNELTUNE_MAX_BODY_BYTES", "0")
    with pytest.raises(ValidationError) as refused:
        Settings(_env_file=None)
    assert settings_problem(refused.value).startswith("KERNELTUNE_MAX_BODY_BYTES: ")
