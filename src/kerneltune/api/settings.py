"""Service settings, read from the environment (prefix ``KERNELTUNE_``) or a ``.env`` file."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

#: The shortest write token accepted: anything shorter is guessable by brute force over HTTP.
MIN_TOKEN_CHARS = 16
#: The variable that hands the log level to the service's worker processes.
ENV_LOG_LEVEL = "KERNELTUNE_LOG_LEVEL"


def _default_database_url() -> str:
    from kerneltune.storage import default_database_url

    return default_database_url()


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="KERNELTUNE_", env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    #: SQLAlchemy URL of the result store; SQLite under the user's data directory by default.
    database_url: str = Field(default_factory=_default_database_url)
    #: Bearer token that `POST /api/v1/results` requires (at least 16 characters). Unset: writes
    #: are disabled.
    write_token: SecretStr | None = None
    #: Origins allowed to call the API from a browser (comma-separated in the environment).
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: Log level of the service's own logger and of uvicorn's.
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = "info"
    #: The largest request body read, in bytes: a larger one gets 413 before it is read whole
    #: (a whole shipped table, about 1.2 MB, fits).
    max_body_bytes: int = Field(default=8 << 20, ge=1024)
    #: Whether a GPU without an entry for a key is answered with the nearest other GPU's entry
    #: at that key (`transfer`) before a nearer shape of its own.
    transfer: bool = True
    #: Reports of untuned keys (`POST /api/v1/misses`, no token) a client may send a second on
    #: average, per worker, and in a burst.
    reports_per_s: float = Field(default=2.0, gt=0)
    reports_burst: int = Field(default=20, ge=1)
    #: How long a request body may take to arrive whole before the request gets 408.
    body_timeout_s: float = Field(default=30.0, gt=0)
    #: How long opening a connection to the store (or waiting for a pooled one) may take.
    database_connect_timeout_s: float = Field(default=5.0, gt=0)
    #: How long one statement may run on PostgreSQL, lock waits included, before the server
    #: cancels it (the request then gets 503).
    database_statement_timeout_s: float = Field(default=15.0, gt=0)
    #: How long `/readyz` waits for the store before it answers 503.
    ready_timeout_s: float = Field(default=2.0, gt=0)

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

    @field_validator("write_token")
    @classmethod
    def _long_enough(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and len(v.get_secret_value()) < MIN_TOKEN_CHARS:
            raise ValueError(
                f"KERNELTUNE_WRITE_TOKEN is {len(v.get_secret_value())} characters long; use at "
                f"least {MIN_TOKEN_CHARS} (e.g. `openssl rand -hex 24`), or unset it for a "
                "read-only service"
            )
        return v

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_level(cls, v: object) -> object:
        return v.lower() if isinstance(v, str) else v


def settings_problem(error: ValidationError) -> str:
    """A settings error in one line: the first problem, named by its environment variable."""
    first = error.errors()[0]
    name = "KERNELTUNE_" + "_".join(str(p) for p in first["loc"]).upper()
    message = str(first["msg"]).removeprefix("Value error, ")
    return message if message.startswith(name) else f"{name}: {message}"
