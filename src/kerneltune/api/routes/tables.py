"""`GET /api/v1/tables/{gpu}`: a GPU model's whole table, what the runtime imports."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Path, Request, Response, status

from kerneltune.api.deps import StoreDep
from kerneltune.api.devices import TableState, TableStates
from kerneltune.api.schemas import MAX_NAME, Error

router = APIRouter(prefix="/api/v1", tags=["tables"])

CACHE_CONTROL = "public, max-age=60"
#: The compressed body is another representation of the same table: its tag says so.
GZIP_SUFFIX = "-gzip"


def etag_matches(if_none_match: str | None, tags: tuple[str, ...]) -> bool:
    """RFC 9110 weak comparison of `If-None-Match` (a list of tags, or `*`) with quoted tags."""
    if not if_none_match:
        return False
    given = [t.strip() for t in if_none_match.split(",")]
    return "*" in given or any(t.removeprefix("W/") in tags for t in given)


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether `Accept-Encoding` names gzip with a nonzero weight."""
    for part in (accept_encoding or "").split(","):
        coding, _, params = part.partition(";")
        if coding.strip().lower() not in ("gzip", "x-gzip"):
            continue
        weight = params.strip().lower()
        if not weight.startswith("q="):
            return True
        try:
            return float(weight[2:]) > 0
        except ValueError:
            return False
    return False


@router.get(
    "/tables/{gpu}",
    responses={
        200: {
            "description": "the table in kerneltune's JSON table format (gzip-compressed for a "
                           "client that accepts it)",
            "content": {"application/json": {"schema": {"type": "object"}}},
        },
        304: {"description": "the table has not changed since the ETag given"},
        404: {"model": Error},
        503: {"model": Error},
    },
)
def table_of(
    request: Request,
    store: StoreDep,
    gpu: Annotated[
        str, Path(min_length=1, max_length=MAX_NAME, description="driver's name or its slug")
    ],
    if_none_match: Annotated[str | None, Header(max_length=2048)] = None,
    accept_encoding: Annotated[str | None, Header(max_length=1024)] = None,
) -> Response:
    """The whole table of a GPU model, exactly as `kerneltune export` writes it, with an ETag
    that changes exactly when the table does; `If-None-Match` with the current one gets 304."""
    states: TableStates = request.app.state.table_states
    with store.session() as session:
        device = request.app.state.device_names.resolve(session, gpu)
        state: TableState | None = states.current(session, device)
    if state is None:  # removed from the store since it was resolved
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"unknown GPU {gpu!r}")
    plain, compressed = f'"{state.tag}"', f'"{state.tag}{GZIP_SUFFIX}"'
    gzipped = accepts_gzip(accept_encoding)
    headers = {"ETag": compressed if gzipped else plain, "Cache-Control": CACHE_CONTROL}
    if etag_matches(if_none_match, (plain, compressed)):
        headers["Vary"] = "Accept-Encoding"
        return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers=headers)
    if gzipped:  # compressed once per version; the app's gzip middleware leaves it as it is
        headers |= {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"}
        return Response(state.gzipped, media_type="application/json", headers=headers)
    # The app's gzip middleware adds `Vary` to a plain body of its size.
    return Response(state.body, media_type="application/json", headers=headers)
