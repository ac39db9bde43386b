"""What the service knows: the GPUs with tables, and the kernels with their parameters."""

from __future__ import annotations

from functools import cache

from fastapi import APIRouter

from kerneltune.api.deps import StoreDep
from kerneltune.api.devices import gpu_infos
from kerneltune.api.schemas import Error, GpuInfo, KernelInfo
from kerneltune.kernels import REGISTRY, KernelSpec

router = APIRouter(prefix="/api/v1", tags=["meta"])

#: The shape at which the parameters' choices are listed (some depend on it).
EXAMPLE_N = EXAMPLE_M = 4096


@router.get("/gpus", response_model=list[GpuInfo], responses={503: {"model": Error}})
def gpus(store: StoreDep) -> list[GpuInfo]:
    """GPU models that have a table: names, slugs, entry counts, measured copy bandwidth."""
    with store.session() as session:
        return gpu_infos(session)


@router.get("/kernels", response_model=list[KernelInfo])
def kernels() -> list[KernelInfo]:
    """The kernels of the family: each tunable parameter with its choices, and the options."""
    return kernel_infos()


@cache
def kernel_infos() -> list[KernelInfo]:
    return [_kernel_info(REGISTRY[name]) for name in sorted(REGISTRY)]


def _kernel_info(spec: KernelSpec) -> KernelInfo:
    example = spec.problem(EXAMPLE_M, EXAMPLE_N, "bfloat16")
    doc = type(spec).__doc__ or spec.module.__doc__ or spec.name
    return KernelInfo(
        name=spec.name,
        description=doc.strip().splitlines()[0],
        kernel_hash=spec.kernel_hash,
        parameters={k: list(v) for k, v in spec.space(example).items()},
        options={k: list(v) for k, v in spec.options.items()},
        default=spec.default(example).to_json(),
    )
