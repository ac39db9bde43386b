"""Request dependencies: settings, the store (opened and closed in a route's worker thread), the
write token; and `in_thread`, the way blocking store work leaves the event loop under a deadline."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, TypeVar

import anyio
import anyio.to_thread
from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session, sessionmaker

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


@dataclass(frozen=True)
class Store:
    """The service's store, opened and closed where its work runs.

    Routes that read or write the store are plain `def` functions, which FastAPI runs in its
    thread pool; each opens what it needs here and closes it before it returns, in that same
    thread. So no connection is taken from the pool, pinged or given back (a rollback over
    the network) on the event loop: a hung database holds request threads, never the loop,
    and never `/healthz`. The hot lookup is an async route that hands its work to `run`.
    """

    engine: Engine
    sessions: sessionmaker[Session]
    #: How long `run` waits for a server's answer: connecting, then one statement.
    deadline_s: float

    @property
    def local(self) -> bool:
        """Whether the store is a local SQLite file (else a database server)."""
        return self.engine.dialect.name == "sqlite"

    async def run(self, work: Callable[[], T]) -> T:
        """`work()` where store work belongs. On a server, in a worker thread given up after
        `deadline_s` (`StoreTimeout`, 503). On SQLite, in the event loop: a read of a local
        file in WAL mode never waits for a writer, and takes less time than the hop to a
        thread and back, which under load on a small host (the GIL handed between the loop
        and the threads) left lookups at 32 connections under half their rate."""
        if self.local:
            return work()
        return await in_thread(work, self.deadline_s)

    def session(self) -> Session:
        """An ORM session, for `with store.session() as session:`; routes that write commit."""
        return self.sessions()

    def connect(self) -> Connection:
        """A pooled connection, for `with store.connect() as connection:`: a statement run on
        it costs a fraction of the same statement through a session, for the hot read path."""
        return self.engine.connect()


async def get_store(request: Request) -> Store:
    # Async on purpose: it does no I/O, and a sync dependency would cost a thread-pool hop.
    return request.app.state.store


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[Store, Depends(get_store)]

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
