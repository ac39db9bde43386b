"""`GET /api/v1/tables/{gpu}`: a GPU model's whole table, what the runtime imports."""

from __future__ import annotations

import threading
from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Path, Request, Response, status

from kerneltune.api.deps import SessionDep
from kerneltune.api.schemas import MAX_NAME, Error
from kerneltune.storage import export_table, table_etag
from kerneltune.table import dumps

router = APIRouter(prefix="/api/v1", tags=["tables"])

CACHE_CONTROL = "public, max-age=60"


class TableBodies:
    """The last rendered body per device, valid for exactly one ETag (the store's fingerprint of
    the table), so an unchanged table is not exported and serialised again on every request."""

    def __init__(self) -> None:
        self._bodies: dict[str, tuple[str, bytes]] = {}
        self._lock = threading.Lock()

    def get(self, device: str, etag: str) -> bytes | None:
        cached = self._bodies.get(device)
        return cached[1] if cached is not None and cached[0] == etag else None

    def put(self, device: str, etag: str, body: bytes) -> None:
        with self._lock:
            self._bodies[device] = (etag, body)


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """RFC 9110 weak comparison of `If-None-Match` (a list of tags, or `*`) with a quoted tag."""
    if not if_none_match:
        return False
    tags = [t.strip() for t in if_none_match.split(",")]
    return "*" in tags or any(t.removeprefix("W/") == etag for t in tags)


@router.get(
    "/tables/{gpu}",
    responses={
        200: {
            "description": "the table in kerneltune's JSON table format",
            "content": {"application/json": {"schema": {"type": "object"}}},
        },
        304: {"description": "the table has not changed since the ETag given"},
        404: {"model": Error},
        503: {"model": Error},
    },
)
def table_of(
    request: Request,
    session: SessionDep,
    gpu: Annotated[
        str, Path(min_length=1, max_length=MAX_NAME, description="driver's name or its slug")
    ],
    if_none_match: Annotated[str | None, Header(max_length=2048)] = None,
) -> Response:
    """The whole table of a GPU model, exactly as `kerneltune export` writes it, with an ETag
    that changes exactly when the table does; `If-None-Match` with the current one gets 304."""
    device = request.app.state.device_names.resolve(session, gpu)
    bodies: TableBodies = request.app.state.table_bodies
    while True:
        token = table_etag(session, device)
        if token is None:  # removed from the store since it was resolved
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"unknown GPU {gpu!r}")
        etag = f'"{token}"'
        headers = {"ETag": etag, "Cache-Control": CACHE_CONTROL}
        if etag_matches(if_none_match, etag):
            return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers=headers)
        body = bodies.get(device, etag)
        if body is not None:
            break
        body = dumps(export_table(session, device)).encode()
        # A write between the tag and the export would pair a newer body with an older tag.
        if table_etag(session, device) == token:
            bodies.put(device, etag, body)
            break
        session.rollback()  # see the newer state on the next round
    return Response(body, media_type="application/json", headers=headers)
