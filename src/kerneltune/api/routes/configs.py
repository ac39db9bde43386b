"""`GET /api/v1/configs/{kernel}`: the config to use for a kernel on a GPU model and shape."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Path, Query, Request, Response, status
from sqlalchemy.orm import Session

from kerneltune.api.answers import results_version
from kerneltune.api.deps import ConnectionDep
from kerneltune.api.schemas import (
    MAX_KERNEL,
    MAX_M,
    MAX_N,
    MAX_NAME,
    ConfigAnswer,
    Dtype,
    Error,
    Key,
    Measurement,
)
from kerneltune.kernels import REGISTRY, KernelSpec
from kerneltune.storage import Result, get_result, nearest_result
from kerneltune.table import lookup_order, m_bucket

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
    connection: ConnectionDep,
    kernel: Annotated[str, Path(min_length=1, max_length=MAX_KERNEL)],
    gpu: Annotated[
        str, Query(min_length=1, max_length=MAX_NAME, description="driver's name or its slug")
    ],
    n: Annotated[int, Query(ge=1, le=MAX_N, description="hidden size (last dimension)")],
    m: Annotated[int, Query(ge=1, le=MAX_M, description="rows (all leading dimensions)")],
    dtype: Annotated[Dtype, Query()] = "bfloat16",
) -> Response:
    """The tuned config for this key (`match=exact`), else the same shape tuned in the other
    16-bit dtype or the closest tuned shape whose config is valid here (`nearest`; `key` says
    which), else the kernel's heuristic (`default`, no measurement). M is rounded up to its
    power-of-two bucket. Entries measured on other kernel source are stale and never served."""
    # Async, so it runs in the event loop: with the answer cached, a lookup reads one indexed
    # aggregate from the store (about 0.1 ms on SQLite), less than a hop to the thread pool and
    # back. ORM reads happen only for a name or an answer not cached yet.
    spec = known_kernel(kernel)
    session = Session(bind=connection)
    device = request.app.state.device_names.resolve(session, gpu)
    bucket = m_bucket(m)
    version = results_version(connection, device)
    answers = request.app.state.answers
    key = (kernel, dtype, n, bucket)
    answer: ConfigAnswer | None = answers.get(device, version, key)
    if answer is None:
        answer = lookup(session, spec, device, dtype, n, bucket)
        answers.put(device, version, key, answer)
    # The answer is the same for every M of the bucket; only the M asked about differs.
    body = answer.model_copy(update={"m": m}).model_dump_json()
    return Response(body, media_type="application/json")


def lookup(session: Session, spec: KernelSpec, device: str, dtype: str, n: int, bucket: int
           ) -> ConfigAnswer:
    """The answer for one key, from the store (every M of a bucket gets the same one)."""
    running = spec.kernel_hash
    tuned = tuned_result(session, spec, device, dtype, n, bucket)
    common = {"kernel": spec.name, "gpu": device, "dtype": dtype, "n": n, "m": bucket,
              "m_bucket": bucket, "kernel_hash": running}
    if tuned is None:
        return ConfigAnswer(**common, match="default", key=None,
                            config=spec.default(spec.problem(bucket, n, dtype)), measurement=None)
    found, match = tuned
    return ConfigAnswer(**common, match=match, key=Key(n=found.n, m=found.m, dtype=found.dtype),
                        config=dict(found.config), measurement=_measurement(found, running))


def tuned_result(session: Session, spec: KernelSpec, device: str, dtype: str, n: int,
                 bucket: int) -> tuple[Result, Literal["exact", "nearest"]] | None:
    """The stored result behind an answer, in the runtime's order: the key itself; the same
    shape in the other 16-bit dtype; the nearest tuned shape in this dtype, then in that one.
    A config that cannot run this shape (e.g. a whole-row block for a longer row) is passed
    over, and so is a result measured on other kernel source."""
    problem = spec.problem(bucket, n, dtype)
    for i, (d, nearest) in enumerate(lookup_order(dtype)):
        if nearest:
            found, _ = nearest_result(session, device, spec.name, d, n, bucket,
                                      kernel_hash=spec.kernel_hash)
        else:
            found = get_result(session, device, spec.name, d, n, bucket,
                               kernel_hash=spec.kernel_hash)
        if found is not None and spec.valid(problem, found.config):
            return found, "nearest" if i else "exact"
    return None


def _measurement(result: Result, running_hash: str) -> Measurement:
    entry = result.to_entry()
    speedup = entry.speedup
    return Measurement(
        us=entry.us, gbps=entry.gbps, frac_copy=entry.frac_copy, default_us=entry.default_us,
        speedup=round(speedup, 4) if speedup == speedup else None, trials=entry.trials,
        kernel_hash=entry.kernel_hash, stale=entry.kernel_hash != running_hash,
    )
