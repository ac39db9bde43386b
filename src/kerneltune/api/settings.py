"""Service settings, read from the environment (prefix ``KERNELTUNE_``) or a ``.env`` file."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


def _default_database_url() -> str:
    from kerneltune.storage import default_database_url

    return default_database_url()


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="KERNELTUNE_", env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    #: SQLAlchemy URL of the result store; SQLite under the user's data directory by default.
    database_url: str = Field(default_factory=_default_database_url)
    #: Bearer token that `POST /api/v1/results` requires. Unset: writes are disabled.
    write_token: SecretStr | None = None
    #: Origins allowed to call the API from a browser (comma-separated in the environment).
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    log_level: str = "info"

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _split_origins(cls, v: object) -> object:
        if isinstance(v, str):
            return [o.strip() for o in v.split(",") if o.strip()]
        return v

    @field_validator("write_token", mode="before")
    @classmethod
    def _empty_token_is_none(cls, v: object) -> object:
        return None if v == "" else v

    @field_validator("log_level")
    @classmethod
    def _lower_level(cls, v: str) -> str:
        return v.lower()
