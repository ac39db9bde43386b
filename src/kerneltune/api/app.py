"""The application factory: settings -> engine -> routers, the request guard, compression and the
page.

`RequestGuard` sits in front of every route: it refuses a write without the token before it
reads the body, reads a body only up to `max_body_bytes` (413 past it, counted while reading)
and for at most `body_timeout_s` (408), runs a request again when the database aborted its
transaction for a conflict (a deadlock or a serialization failure), and answers a store error
by what it means: 503 with `Retry-After` for a store that may come back, 503 without it for one
that will not by itself, 422 for a value the database refuses. Routes stay free of all of it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from sqlalchemy.exc import SQLAlchemyError
from starlette.datastructures import Headers
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kerneltune.api import page
from kerneltune.api.answers import AnswersByVersion
from kerneltune.api.deps import Store, StoreTimeout, require_writer, writer_refusal
from kerneltune.api.devices import DeviceNames, TableStates
from kerneltune.api.rate import RateLimit
from kerneltune.api.routes import configs, health, meta, misses, results, tables
from kerneltune.api.settings import Settings
from kerneltune.storage import (
    TRANSACTION_ATTEMPTS,
    ErrorKind,
    StoreGoneError,
    error_kind,
    make_engine,
    retry_delay_s,
    session_factory,
)

log = logging.getLogger("kerneltune.api")

DESCRIPTION = """\
Which launch config to use for a kernel of the kerneltune family, on a GPU model and a shape.

Reads are open; `POST /api/v1/results` needs `Authorization: Bearer <KERNELTUNE_WRITE_TOKEN>`.
"""

#: Seconds a client is told to wait after a conflict that outlived the retries, and after a
#: store that could not be reached.
RETRY_AFTER_CONFLICT_S = 1
RETRY_AFTER_UNAVAILABLE_S = 5
#: Responses at least this large are gzip-compressed for clients that accept it.
GZIP_MIN_BYTES = 1024
#: Readiness probes that may wait on a hung store at once (apart from the request threads).
READINESS_THREADS = 4
_NO_BODY_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


def create_app(settings: Settings | None = None) -> FastAPI:
    """The service over the store named by `settings.database_url` (environment by default).

    The engine is created here and disposed of at shutdown; connecting is lazy, so the app starts
    (and `/healthz` answers) while the database is down, and `/readyz` says why it is not ready.
    """
    settings = settings or Settings()
    # "trace" is uvicorn's own level, below debug.
    log.setLevel("DEBUG" if settings.log_level == "trace" else settings.log_level.upper())
    engine = make_engine(
        settings.database_url,
        connect_timeout_s=settings.database_connect_timeout_s,
        statement_timeout_s=settings.database_statement_timeout_s,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        engine.dispose()

    # The docs pages from the package's own Swagger UI and ReDoc files, not a CDN: /docs works
    # on a machine with no way out.
    app = FastAPIOffline(
        title="kerneltune",
        version=_version(),
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.store = Store(engine, session_factory(engine), settings.database_connect_timeout_s
                            + settings.database_statement_timeout_s)
    app.state.table_states = TableStates()
    app.state.device_names = DeviceNames()
    app.state.answers = AnswersByVersion()
    app.state.readiness_limiter = anyio.CapacityLimiter(READINESS_THREADS)

    app.state.report_limit = RateLimit(settings.reports_per_s, settings.reports_burst)

    routers = (health.router, configs.router, tables.router, meta.router, results.router,
               misses.router)
    routes = [r for router in routers for r in router.routes if isinstance(r, APIRoute)]
    # Outermost last: compression sees every answer, CORS headers go on refusals too.
    app.add_middleware(RequestGuard, settings=settings, routes=routes)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "If-None-Match"],
            expose_headers=["ETag"],
        )
    app.add_middleware(GZipMiddleware, minimum_size=GZIP_MIN_BYTES, compresslevel=6)

    for router in routers:
        app.include_router(router)
    app.include_router(page.router)
    app.mount("/static", StaticFiles(directory=page.STATIC_DIR), name="static")
    return app


class RequestGuard:
    """ASGI middleware in front of the routes (see the module's docstring).

    A body is read here, whole and bounded, before the route sees it: FastAPI reads a body
    before it resolves a route's dependencies, so a token checked there comes after the whole
    body was taken in; and a request aborted by a conflict can be run again only with its body
    kept. A request for none of `routes` (404, 405, the page) is passed on unread.
    """

    def __init__(self, app: ASGIApp, *, settings: Settings, routes: list[APIRoute]) -> None:
        self.app = app
        self.settings = settings
        self.routes = routes
        self._writes = {id(r): _depends_on(r, require_writer) for r in routes}
        # A route may read less than the service-wide cap (`x-max-body-bytes` in its OpenAPI).
        self._caps = {id(r): min(settings.max_body_bytes,
                                 (r.openapi_extra or {}).get("x-max-body-bytes", 1 << 62))
                      for r in routes}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body: bytes | None = None
        if scope["method"] not in _NO_BODY_METHODS:
            route = self._route(scope)
            if route is None:
                await self.app(scope, receive, send)
                return
            headers = Headers(scope=scope)
            if self._writes[id(route)]:
                refusal = writer_refusal(self.settings, headers.get("authorization"))
                if refusal is not None:
                    await _error(refusal.status_code, str(refusal.detail),
                                 refusal.headers)(scope, receive, send)
                    return
            body = await self._read_body(scope, headers, receive, send, self._caps[id(route)])
            if body is None:
                return
        await self._run(scope, receive, send, body)

    def _route(self, scope: Scope) -> APIRoute | None:
        for route in self.routes:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return route
        return None

    async def _read_body(self, scope: Scope, headers: Headers, receive: Receive,
                         send: Send, limit: int) -> bytes | None:
        """The whole body, or None once a refusal was sent (or the client left): 413 past
        `limit` (`max_body_bytes`, or the route's own), counted while reading; 408 when it
        has not all come within `body_timeout_s`, so a client that trickles a body holds its
        connection, not a worker's memory or time."""
        deadline = self.settings.body_timeout_s
        declared = headers.get("content-length")
        refused = 413 if declared is not None and declared.isdigit() and int(declared) > limit \
            else None
        body = None
        if refused is None:
            with anyio.move_on_after(deadline) as timer:
                try:
                    body = await _receive_body(receive, limit)
                except _BodyTooLarge:
                    refused = 413
            if timer.cancelled_caught:
                refused = 408
        if refused == 413:
            setting = " (KERNELTUNE_MAX_BODY_BYTES)" if limit == self.settings.max_body_bytes \
                else ""
            await _error(413, f"request body over {limit} bytes{setting}")(scope, receive, send)
        elif refused == 408:
            await _error(408, f"request body not received within {deadline:g} s "
                         "(KERNELTUNE_BODY_TIMEOUT_S)", {"Connection": "close"}
                         )(scope, receive, send)
        return None if refused else body

    async def _run(self, scope: Scope, receive: Receive, send: Send, body: bytes | None) -> None:
        """The route, run again (after a jittered pause) while the database aborts its
        transaction for a conflict; a store error that ends it is answered by its kind."""
        for attempt in range(1, TRANSACTION_ATTEMPTS + 1):
            started = False

            async def tracked(message: Message) -> None:
                nonlocal started
                started = True
                await send(message)

            replay = receive if body is None and attempt == 1 else _replay(body or b"", receive)
            try:
                await self.app(scope, replay, tracked)
                return
            except (SQLAlchemyError, StoreTimeout) as e:
                if started:
                    raise
                kind = ErrorKind.UNAVAILABLE if isinstance(e, StoreTimeout) else error_kind(e)
                if kind is ErrorKind.CONFLICT and attempt < TRANSACTION_ATTEMPTS:
                    log.info("%s %s: store conflict (%s), attempt %d", scope["method"],
                             scope["path"], _cause(e), attempt)
                    await anyio.sleep(retry_delay_s(attempt))
                    continue
                await store_error_response(scope, e, kind)(scope, receive, send)
                return


class _BodyTooLarge(Exception):
    pass


async def _receive_body(receive: Receive, limit: int) -> bytes | None:
    """The request body, at most `limit` bytes (`_BodyTooLarge` past it); None when the client
    left."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _depends_on(route: APIRoute, call: Callable[..., Any]) -> bool:
    """Whether `route` depends on `call`, at any depth."""
    stack = [route.dependant]
    while stack:
        dependant = stack.pop()
        if dependant.call is call:
            return True
        stack.extend(dependant.dependencies)
    return False


def store_error_response(scope: Scope, error: Exception, kind: ErrorKind) -> JSONResponse:
    """503 with Retry-After where the same request may succeed later (a conflict, a store that
    cannot be reached or timed out), 503 without it where the store is broken until someone
    acts (not migrated, its file gone), 422 where the database refuses a value of the request."""
    where = f"{scope['method']} {scope['path']}"
    if kind is ErrorKind.REFUSED:
        log.warning("store refused a value on %s: %s", where, _cause(error))
        return _error(422, f"the store refused a value of this request: {_message(error)}")
    log.error("database error on %s: %s", where, _cause(error))
    if kind is ErrorKind.BROKEN:
        reason = (
            "the store's file was deleted or replaced since the service opened it"
            if isinstance(error, StoreGoneError) else _cause(error)
        )
        return _error(503, f"database unavailable: {reason}")
    retry = RETRY_AFTER_CONFLICT_S if kind is ErrorKind.CONFLICT else RETRY_AFTER_UNAVAILABLE_S
    reason = str(error) if isinstance(error, StoreTimeout) else _cause(error)
    return _error(503, f"database unavailable: {reason}", {"Retry-After": str(retry)})


def _error(status_code: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status_code, headers=headers)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the kept body once, then whatever the client sends (its leaving)."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def _cause(error: BaseException) -> str:
    """The driver's error class: names what happened, shows no statement or value."""
    return type(getattr(error, "orig", None) or error).__name__


def _message(error: BaseException) -> str:
    lines = str(getattr(error, "orig", None) or error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kerneltune")
    except PackageNotFoundError:
        return "0"
