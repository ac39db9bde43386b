"""Service settings from the environment."""

from __future__ import annotations

from kerneltune.api.settings import Settings
from kerneltune.storage import default_database_url


def test_settings_from_the_environment(monkeypatch):
    monkeypatch.setenv("KERNELTUNE_DATABASE_URL", "postgresql+psycopg://u@h/db")
    monkeypatch.setenv("KERNELTUNE_WRITE_TOKEN", "s3cret-value")
    monkeypatch.setenv("KERNELTUNE_CORS_ORIGINS", "http://a.test, http://b.test")
    monkeypatch.setenv("KERNELTUNE_LOG_LEVEL", "WARNING")
    s = Settings(_env_file=None)
    assert s.database_url == "postgresql+psycopg://u@h/db"
    assert s.write_token is not None and s.write_token.get_secret_value() == "s3cret-value"
    assert "s3cret-value" not in repr(s)
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
