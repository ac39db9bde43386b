"""`POST /api/v1/results`: remote tuning workers publish what they measured.

All or nothing: a body that is not strict JSON (`kerneltune.api.checks`), an entry the table
format refuses, an unknown kernel or a config its kernel refuses at the entry's own key makes
the whole request a 422 naming each refused entry, and nothing is stored.
"""

from __future__ import annotations

from dataclasses import replace

from fastapi import APIRouter, Request

from kerneltune.api.checks import (
    StrictJSONRoute,
    entry_errors,
    raise_body_refusal,
    refused,
    table_refusal,
)
from kerneltune.api.deps import StoreDep, WriterDep
from kerneltune.api.schemas import Error, ResultsIn, ResultsOut, TuningKey
from kerneltune.kernels import running_hashes
from kerneltune.storage import upsert_results
from kerneltune.table import Env, Table, TableError, table_from_dict

router = APIRouter(prefix="/api/v1", tags=["results"], route_class=StrictJSONRoute)


def parse_results(body: ResultsIn) -> Table:
    """The body as a table, checked by the table format's own validator (power-of-two M
    buckets, no duplicate keys), against the kernels this service knows and against each
    kernel's space at the entry's key (`kerneltune.api.checks.entry_errors`)."""
    doc = body.model_dump(by_alias=True, exclude_none=True)
    doc.setdefault("env", {})
    try:
        table = table_from_dict(doc)
    except TableError as e:
        raise table_refusal(e) from None
    errors = entry_errors(table)
    if errors:
        raise refused(*errors)
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
        503: {"model": Error},
    },
)
def publish_results(request: Request, store: StoreDep, body: ResultsIn) -> ResultsOut:
    """Store each entry that is new, faster than a stored one measured on the same kernel
    source, or measured on this service's source where the stored one was not (the tuner's own
    atomic upsert); the others are kept as they are. Accepts `{device, entries}` or a whole
    table document. Needs the write token.

    422, with nothing stored, for a body that is not strict JSON (NaN, Infinity, a lone
    surrogate, a NUL character), no entries, or any entry the service may not store: each is
    named by its index and key, and the parameter at fault where there is one."""
    raise_body_refusal(request)
    table = parse_results(body)
    running = running_hashes()
    with store.session() as session, session.begin():  # in key order: no two writers deadlock
        written = upsert_results(session, table.device, table.entries,
                                 copy_gbps=table.copy_gbps, running_hashes=running)
    keys = [TuningKey(kernel=e.kernel, dtype=e.dtype, n=e.n, m=e.m) for e in table.entries]
    return ResultsOut(device=table.device,
                      stored=[k for k, w in zip(keys, written, strict=True) if w],
                      kept=[k for k, w in zip(keys, written, strict=True) if not w])
