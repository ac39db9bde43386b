"""`GET /api/v1/configs/{kernel}`: the config to use for a kernel on a GPU model and shape."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, Request, Response, status
from sqlalchemy.orm import Session

from kerneltune.api.answers import cached_config_answer, versions
from kerneltune.api.deps import StoreDep
from kerneltune.api.schemas import (
    MAX_KERNEL,
    MAX_M,
    MAX_N,
    MAX_NAME,
    ConfigAnswer,
    Dtype,
    Error,
)
from kerneltune.kernels import REGISTRY, KernelSpec
from kerneltune.table import m_bucket

router = APIRouter(prefix="/api/v1", tags=["configs"])


def known_kernel(kernel: str) -> KernelSpec:
    spec = REGISTRY.get(kernel)
    if spec is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"unknown kernel {kernel!r}; known kernels: {', '.join(sorted(REGISTRY))}",
        )
    return spec


@router.get(
    "/configs/{kernel}",
    response_model=ConfigAnswer,
    responses={404: {"model": Error}, 503: {"model": Error}},
)
async def config_for(
    request: Request,
    store: StoreDep,
    kernel: Annotated[str, Path(min_length=1, max_length=MAX_KERNEL)],
    gpu: Annotated[
        str, Query(min_length=1, max_length=MAX_NAME, description="driver's name or its slug")
    ],
    n: Annotated[int, Query(ge=1, le=MAX_N, description="hidden size (last dimension)")],
    m: Annotated[int, Query(ge=1, le=MAX_M, description="rows (all leading dimensions)")],
    dtype: Annotated[Dtype, Query()] = "bfloat16",
) -> Response:
    """The tuned config for this key (`match=exact`), else the same shape tuned in the other
    16-bit dtype (`nearest`), else the same shape tuned on the nearest other GPU (`transfer`,
    `transfer_from` names it; same compute capability first, then nearest copy bandwidth;
    `KERNELTUNE_TRANSFER=0` turns it off), else the closest tuned shape whose config is valid
    here (`nearest`; `key` says which), else the kernel's heuristic (`default`, no
    measurement): the runtime's rule (`kerneltune.resolution.resolve`) over the results. M is
    rounded up to its power-of-two bucket. Entries measured on other kernel source are stale
    and never served."""
    # With the answer cached, a lookup reads one statement of indexed aggregates on a bare
    # connection; ORM reads happen only for a name or a kernel's table not cached yet.
    spec = known_kernel(kernel)
    state = request.app.state

    def lookup() -> ConfigAnswer:
        with store.connect() as connection:
            session = Session(bind=connection)
            device = state.device_names.resolve(session, gpu)
            bucket = m_bucket(m)
            found = versions(connection, device, spec.name, n, bucket, dtype)
            return cached_config_answer(state.answers, found, session, spec, device, dtype, n,
                                        bucket, transfer=state.settings.transfer)

    answer = await store.run(lookup)
    # The answer is the same for every M of the bucket; only the M asked about differs.
    body = answer.model_copy(update={"m": m}).model_dump_json()
    return Response(body, media_type="application/json")
