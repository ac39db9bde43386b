"""Request dependencies: settings, a database session or connection per request, the write
token."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Connection
from sqlalchemy.orm import Session

from kerneltune.api.settings import Settings


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
    costs a fraction of the same statement through an ORM session and its close."""
    with request.app.state.engine.connect() as connection:
        yield connection


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
ConnectionDep = Annotated[Connection, Depends(get_connection)]

_bearer = HTTPBearer(auto_error=False, description="KERNELTUNE_WRITE_TOKEN of the service")


def require_writer(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Writes need `Authorization: Bearer <KERNELTUNE_WRITE_TOKEN>`; without a configured token
    the service is read-only."""
    if settings.write_token is None:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "writes are disabled: the service has no KERNELTUNE_WRITE_TOKEN configured",
        )
    challenge = {"WWW-Authenticate": "Bearer"}
    if credentials is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "missing bearer token", headers=challenge
        )
    given = credentials.credentials.encode()
    expected = settings.write_token.get_secret_value().encode()
    if not secrets.compare_digest(given, expected):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "invalid bearer token", headers=challenge)


WriterDep = Depends(require_writer)
