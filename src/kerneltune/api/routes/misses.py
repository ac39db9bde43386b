"""`POST /api/v1/misses` and `GET /api/v1/misses/{gpu}`: the keys model processes ran untuned.

Runtimes with `KERNELTUNE_REPORT=1` report the keys they resolved other than exactly; tuning
workers (`kerneltune tune --follow`) take the most-met untuned ones, tune them and publish the
results, which runtimes then pick up through the table's ETag. Reporting needs no token, so it
is bounded instead: a small body (`MAX_REPORT_BYTES`, `MAX_REPORT_KEYS` keys) and a rate per
client (`KERNELTUNE_REPORTS_PER_S`, bursts of `KERNELTUNE_REPORTS_BURST`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, Request, status

from kerneltune.api.checks import StrictJSONRoute, error, raise_body_refusal, refused
from kerneltune.api.deps import StoreDep
from kerneltune.api.rate import retry_after
from kerneltune.api.schemas import (
    MAX_NAME,
    Error,
    MissesIn,
    MissesOut,
    MissesRecorded,
    MissOut,
)
from kerneltune.kernels import REGISTRY, running_hashes
from kerneltune.storage import MAX_MISSES, MissReport, list_misses, record_misses

router = APIRouter(prefix="/api/v1", tags=["misses"], route_class=StrictJSONRoute)

#: The largest report read; the request guard enforces it (`x-max-body-bytes`).
MAX_REPORT_BYTES = 64 << 10


@router.post(
    "/misses",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=MissesRecorded,
    responses={413: {"model": Error}, 429: {"model": Error}, 503: {"model": Error}},
    openapi_extra={"x-max-body-bytes": MAX_REPORT_BYTES},
)
def report_misses(request: Request, store: StoreDep, body: MissesIn) -> MissesRecorded:
    """Record the keys a model process ran untuned on a GPU model: how many processes met each
    and the row counts they met. No token needed; 429 with `Retry-After` past the client's
    rate, 422 for an M that is not a power-of-two bucket. Keys of kernels this service does
    not know (a plug-in the model's runtime has) are left out and named, the others kept."""
    raise_body_refusal(request)
    wait = request.app.state.report_limit.take(request.client.host if request.client else "")
    if wait:
        raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS,
                            "too many reports from this client (KERNELTUNE_REPORTS_PER_S)",
                            headers={"Retry-After": retry_after(wait)})
    errors = [error(("body", "keys", i, "m"), "M must be a power-of-two bucket")
              for i, key in enumerate(body.keys) if key.m & (key.m - 1)]
    if errors:
        raise refused(*errors)
    known = [k for k in body.keys if k.kernel in REGISTRY]
    reports = [MissReport(kernel=k.kernel, dtype=k.dtype, n=k.n, m=k.m, processes=k.processes,
                          rows=tuple(k.rows)) for k in known]
    if reports:
        with store.session() as session, session.begin():
            record_misses(session, body.device, reports)
    unknown = sorted({k.kernel for k in body.keys} - set(REGISTRY))
    return MissesRecorded(device=body.device, recorded=len(reports), unknown_kernels=unknown)


@router.get("/misses/{gpu}", response_model=MissesOut, responses={503: {"model": Error}})
def misses_of(
    store: StoreDep,
    gpu: Annotated[str, Path(min_length=1, max_length=MAX_NAME,
                             description="the driver's name, as runtimes report it")],
    untuned: Annotated[bool, Query(description="only keys the store has no current entry "
                                               "for")] = True,
    limit: Annotated[int, Query(ge=1, le=MAX_MISSES)] = 100,
) -> MissesOut:
    """A GPU model's reported keys, met by the most processes first: by default only those
    still untuned (no entry measured on the running kernel code). Empty for a GPU no runtime
    reported."""
    with store.session() as session:
        found = list_misses(session, gpu, running_hashes(), untuned_only=untuned, limit=limit)
    return MissesOut(device=gpu, keys=[MissOut(**vars(m)) for m in found])
