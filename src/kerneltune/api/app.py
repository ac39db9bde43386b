"""The application factory: settings -> engine -> routers, error handlers and the page."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy.exc import SQLAlchemyError

from kerneltune.api import page
from kerneltune.api.answers import AnswersByVersion
from kerneltune.api.devices import DeviceNames
from kerneltune.api.routes import configs, health, meta, results, tables
from kerneltune.api.routes.tables import TableBodies
from kerneltune.api.settings import Settings
from kerneltune.storage import make_engine, session_factory

log = logging.getLogger("kerneltune.api")

DESCRIPTION = """\
Which launch config to use for a kernel of the kerneltune family, on a GPU model and a shape.

Reads are open; `POST /api/v1/results` needs `Authorization: Bearer <KERNELTUNE_WRITE_TOKEN>`.
"""


def create_app(settings: Settings | None = None) -> FastAPI:
    """The service over the store named by `settings.database_url` (environment by default).

    The engine is created here and disposed of at shutdown; connecting is lazy, so the app starts
    (and `/healthz` answers) while the database is down, and `/readyz` says why it is not ready.
    """
    settings = settings or Settings()
    engine = make_engine(settings.database_url)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        engine.dispose()

    app = FastAPI(
        title="kerneltune",
        version=_version(),
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessions = session_factory(engine)
    app.state.table_bodies = TableBodies()
    app.state.device_names = DeviceNames()
    app.state.answers = AnswersByVersion()

    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "If-None-Match"],
            expose_headers=["ETag"],
        )
    app.add_exception_handler(SQLAlchemyError, _database_unavailable)

    for router in (health.router, configs.router, tables.router, meta.router, results.router):
        app.include_router(router)
    app.include_router(page.router)
    app.mount("/static", StaticFiles(directory=page.STATIC_DIR), name="static")
    return app


async def _database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    """A database that is down or failing makes the service unavailable, not broken: 503."""
    log.error("database error on %s %s: %s", request.method, request.url.path, exc)
    return JSONResponse(
        {"detail": f"database unavailable: {type(exc).__name__}"},
        status_code=503,
        headers={"Retry-After": "5"},
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kerneltune")
    except PackageNotFoundError:
        return "0"
