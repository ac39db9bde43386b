"""Liveness (no database) and readiness (database reachable and migrated)."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError

from kerneltune.api.schemas import Error, Health, Ready
from kerneltune.storage import is_migrated

router = APIRouter(tags=["health"])
log = logging.getLogger(__name__)


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process is alive and serving (the database is not consulted)."""
    return Health(status="ok")


@router.get("/readyz", response_model=Ready, responses={503: {"model": Error}})
def readyz(request: Request) -> Ready | JSONResponse:
    """The database answers and carries the current schema."""
    try:
        migrated = is_migrated(request.app.state.engine)
    except SQLAlchemyError as e:
        log.warning("readiness: database unreachable: %s", e)
        reason = f"database unreachable: {type(e.__cause__ or e).__name__}"
        return JSONResponse({"detail": reason}, status_code=503)
    if not migrated:
        reason = "database is not migrated (`kerneltune serve` and `kerneltune tune` migrate it)"
        return JSONResponse({"detail": reason}, status_code=503)
    return Ready(status="ready")
