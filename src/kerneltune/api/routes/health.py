"""Liveness (no database) and readiness (database reachable and migrated, within a deadline)."""

from __future__ import annotations

import functools
import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError

from kerneltune.api.deps import StoreTimeout, in_thread
from kerneltune.api.schemas import Error, Health, Ready
from kerneltune.api.settings import Settings
from kerneltune.storage import StoreGoneError, is_migrated

router = APIRouter(tags=["health"])
log = logging.getLogger(__name__)


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process is alive and serving (the database is not consulted)."""
    return Health(status="ok")


@router.get("/readyz", response_model=Ready, responses={503: {"model": Error}})
async def readyz(request: Request) -> Ready | JSONResponse:
    """The database answers, within `KERNELTUNE_READY_TIMEOUT_S`, and carries the current
    schema; and, on SQLite, its file is still the one the service opened."""
    settings: Settings = request.app.state.settings
    check = functools.partial(is_migrated, request.app.state.engine)
    try:
        migrated = await in_thread(check, settings.ready_timeout_s,
                                   request.app.state.readiness_limiter)
    except StoreTimeout:
        reason = f"database did not answer within {settings.ready_timeout_s:g} s"
        log.warning("readiness: %s", reason)
        return JSONResponse({"detail": reason}, status_code=503)
    except StoreGoneError:
        reason = ("database file deleted or replaced since the service opened it; restart the "
                  "service on the store it should use")
        log.error("readiness: %s", reason)
        return JSONResponse({"detail": reason}, status_code=503)
    except SQLAlchemyError as e:
        log.warning("readiness: database unreachable: %s", e)
        reason = f"database unreachable: {type(e.__cause__ or e).__name__}"
        return JSONResponse({"detail": reason}, status_code=503)
    if not migrated:
        reason = "database is not migrated (`kerneltune serve` and `kerneltune tune` migrate it)"
        return JSONResponse({"detail": reason}, status_code=503)
    return Ready(status="ready")
