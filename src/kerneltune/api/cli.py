"""`kerneltune serve`: prepare the store, then run the service under uvicorn."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from kerneltune._store_errors import store_errors
from kerneltune.storage import ENV_DATABASE_URL, default_database_url

APP_FACTORY = "kerneltune.api.app:create_app"


def serve(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port.")] = 8000,
    database_url: Annotated[
        str | None,
        typer.Option(
            help="SQLAlchemy URL of the store (default: $KERNELTUNE_DATABASE_URL, else an SQLite "
            "file in the user's data directory)."
        ),
    ] = None,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes.")] = 1,
    log_level: Annotated[str | None, typer.Option(
        help="Log level of the service and uvicorn (default: $KERNELTUNE_LOG_LEVEL, else info)."
    )] = None,
) -> None:
    """Serve tuned configs over HTTP: migrate the store, load the shipped tables into it when it
    is the default store or empty, then run the API (docs at /docs, a page at /)."""
    import uvicorn
    from pydantic import ValidationError

    from kerneltune.api.bootstrap import prepare_database
    from kerneltune.api.settings import ENV_LOG_LEVEL, Settings, settings_problem

    url = database_url or default_database_url()
    try:  # what every worker will read: refused here once, in one line, not per worker
        settings = Settings(database_url=url, **({"log_level": log_level} if log_level else {}))
    except ValidationError as e:
        typer.echo(f"kerneltune serve: {settings_problem(e)}", err=True)
        raise typer.Exit(1) from None
    with store_errors(url):
        stored = prepare_database(url)
    if stored:
        typer.echo(f"loaded {stored} entries from the shipped tables")
    # Workers build their app from the environment, so hand them the store through it.
    os.environ[ENV_DATABASE_URL] = url
    os.environ[ENV_LOG_LEVEL] = settings.log_level
    uvicorn.run(
        APP_FACTORY, factory=True, host=host, port=port, workers=workers,
        log_level=settings.log_level, proxy_headers=True,
        # A worker imports torch and the kernels before it answers the supervisor's first ping.
        timeout_worker_healthcheck=120,
    )


if __name__ == "__main__":
    typer.run(serve)
