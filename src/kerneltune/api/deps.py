"""Request dependencies: settings, a database session or connection per request, the write
token; and `in_thread`, the way blocking store work leaves the event loop under a deadline."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable
from typing import Annotated, TypeVar

import anyio
import anyio.to_thread
from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from sqlalchemy import Connection
from sqlalchemy.orm import Session

from kerneltune.api.settings import Settings

T = TypeVar("T")


class StoreTimeout(TimeoutError):
    """The store did not answer within the deadline (a hung server or network)."""


async def in_thread(work: Callable[[], T], deadline_s: float,
                    limiter: anyio.CapacityLimiter | None = None) -> T:
    """`work()` in a worker thread, given up after `deadline_s` (raising `StoreTimeout`): the
    event loop, and with it `/healthz` and every other request, never waits on the store. A
    thread stuck in a hung driver call is left behind, not waited for."""
    try:
        with anyio.fail_after(deadline_s):
            return await anyio.to_thread.run_sync(work, abandon_on_cancel=True, limiter=limiter)
    except TimeoutError as e:
        raise StoreTimeout(f"the store did not answer within {deadline_s:g} s") from e


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_session(request: Request) -> AsyncIterator[Session]:
    """One session per request, closed afterwards; routes that write commit themselves.

    Async on purpose: opening a session does no I/O, and a sync generator would cost two
    thread-pool hops per request (a third of a lookup's time). The (sync) routes use it in
    their worker thread; closing returns the connection to the pool.
    """
    with request.app.state.sessions() as session:
        yield session


async def get_connection(request: Request) -> AsyncIterator[Connection]:
    """One pooled connection per request, for the hot read path: a statement executed on it
    costs a fraction of the same statement through an ORM session and its close.

    On SQLite, checking a connection out is local file work and stays in the event loop. Over a
    network it is not (a connect, the pool's ping, the rollback when it is returned), so there
    the checkout runs in a thread, given up after the connect timeout (503), and the return
    too: a hung database server never stops the event loop here.
    """
    engine = request.app.state.engine
    if engine.dialect.name == "sqlite":
        with engine.connect() as connection:
            yield connection
        return
    settings: Settings = request.app.state.settings
    connection = await in_thread(engine.connect, settings.database_connect_timeout_s)
    try:
        yield connection
    finally:
        await anyio.to_thread.run_sync(connection.close, abandon_on_cancel=True)


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
ConnectionDep = Annotated[Connection, Depends(get_connection)]

_bearer = HTTPBearer(auto_error=False, description="KERNELTUNE_WRITE_TOKEN of the service")
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def writer_refusal(settings: Settings, authorization: str | None) -> HTTPException | None:
    """Why a request with this `Authorization` header may not write (None: it may). Checked
    from the headers alone, so the service refuses before it reads a byte of the body."""
    if settings.write_token is None:
        return HTTPException(
            status.HTTP_403_FORBIDDEN,
            "writes are disabled: the service has no KERNELTUNE_WRITE_TOKEN configured",
        )
    scheme, given = get_authorization_scheme_param(authorization)
    if not authorization or scheme.lower() != "bearer" or not given:
        return HTTPException(status.HTTP_401_UNAUTHORIZED, "missing bearer token",
                             headers=_CHALLENGE)
    expected = settings.write_token.get_secret_value().encode()
    if not secrets.compare_digest(given.encode(), expected):
        return HTTPException(status.HTTP_401_UNAUTHORIZED, "invalid bearer token",
                             headers=_CHALLENGE)
    return None


def require_writer(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Writes need `Authorization: Bearer <KERNELTUNE_WRITE_TOKEN>`; without a configured token
    the service is read-only. (The app's request guard already refused, before reading the
    body, any request that fails this; this dependency documents it in the OpenAPI schema.)"""
    header = None if credentials is None else f"Bearer {credentials.credentials}"
    refusal = writer_refusal(settings, header)
    if refusal is not None:
        raise refusal


WriterDep = Depends(require_writer)
