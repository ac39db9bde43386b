"""`POST /api/v1/results`: remote tuning workers publish what they measured."""

from __future__ import annotations

from dataclasses import replace

from fastapi import APIRouter, HTTPException, status

from kerneltune.api.deps import SessionDep, WriterDep
from kerneltune.api.schemas import Error, ResultsIn, ResultsOut, TuningKey
from kerneltune.kernels import REGISTRY, running_hashes
from kerneltune.storage import upsert_device, upsert_result
from kerneltune.table import Env, Table, TableError, table_from_dict

router = APIRouter(prefix="/api/v1", tags=["results"])


def parse_results(body: ResultsIn) -> Table:
    """The body as a table, checked by the table format's own validator (power-of-two M
    buckets, no duplicate keys) and against the kernels this service knows."""
    doc = body.model_dump(by_alias=True, exclude_none=True)
    doc.setdefault("env", {})
    try:
        table = table_from_dict(doc)
    except TableError as e:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(e)) from None
    unknown = sorted({e.kernel for e in table.entries} - set(REGISTRY))
    if unknown:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            f"unknown kernels {unknown}; known kernels: {', '.join(sorted(REGISTRY))}",
        )
    if table.env != Env():  # a document's env describes entries that carry none of their own
        table.entries = [e if e.env else replace(e, env=table.env) for e in table.entries]
    return table


@router.post(
    "/results",
    response_model=ResultsOut,
    dependencies=[WriterDep],
    responses={
        401: {"model": Error, "description": "missing or wrong bearer token"},
        403: {"model": Error, "description": "writes are disabled (no token configured)"},
        422: {"model": Error},
        503: {"model": Error},
    },
)
def publish_results(session: SessionDep, body: ResultsIn) -> ResultsOut:
    """Store each entry that is new, faster than a stored one measured on the same kernel
    source, or measured on this service's source where the stored one was not (the tuner's own
    atomic upsert); the others are kept as they are. Accepts `{device, entries}` or a whole
    table document. Needs the write token."""
    table = parse_results(body)
    running = running_hashes()
    stored: list[TuningKey] = []
    kept: list[TuningKey] = []
    with session.begin():
        if table.copy_gbps is not None:
            upsert_device(session, table.device, copy_gbps=table.copy_gbps)
        for entry in table.entries:
            key = TuningKey(kernel=entry.kernel, dtype=entry.dtype, n=entry.n, m=entry.m)
            written = upsert_result(session, table.device, entry,
                                    running_hash=running[entry.kernel])
            (stored if written else kept).append(key)
    return ResultsOut(device=table.device, stored=stored, kept=kept)
