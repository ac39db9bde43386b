"""The Triton RMSNorm kernel family, each kernel a `KernelSpec` in `REGISTRY`.

A new kernel is a new module here plus one line in `REGISTRY`.
"""

from kerneltune.kernels import add_rmsnorm, rmsnorm_bwd, rmsnorm_fwd, rmsnorm_quant
from kerneltune.kernels._spec import (
    TORCH_DTYPES,
    Inputs,
    KernelSpec,
    Outputs,
    Problem,
    compare_outputs,
    interpreting,
)

REGISTRY: dict[str, KernelSpec] = {
    spec.name: spec
    for spec in (
        rmsnorm_fwd.SPEC,
        rmsnorm_bwd.SPEC,
        add_rmsnorm.SPEC,
        rmsnorm_quant.SPEC,
    )
}


def get_spec(name: str) -> KernelSpec:
    """The spec of a kernel by name; a clear error naming the known ones otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown kernel {name!r}; known: {sorted(REGISTRY)}") from None


__all__ = [
    "REGISTRY",
    "TORCH_DTYPES",
    "Inputs",
    "KernelSpec",
    "Outputs",
    "Problem",
    "compare_outputs",
    "get_spec",
    "interpreting",
]
