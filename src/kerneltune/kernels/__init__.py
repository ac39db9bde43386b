"""The Triton RMSNorm kernel family, each kernel a `KernelSpec` in `REGISTRY`.

Each op has two modules: `<op>.py`, its device code (the Triton kernels with their maths, and the
launcher), whose Triton functions' hash marks tuned tables stale when it changes
(`_spec.device_code_hash`); and `<op>_spec.py`, its `KernelSpec` (inputs, float64 reference and
check, search space, default config, its typed config from `_config`). A new kernel is such a
pair plus one line in `REGISTRY`, or an entry point of the group ``kerneltune.kernels``
(`_plugins`), through which LayerNorm and kernels of other distributions join it.
"""

from dataclasses import replace

from kerneltune.kernels import (
    add_rmsnorm_spec,
    rmsnorm_bwd_spec,
    rmsnorm_fwd_spec,
    rmsnorm_quant_spec,
)
from kerneltune.kernels._config import (
    BackwardConfig,
    ForwardConfig,
    KernelConfig,
    QuantConfig,
    RowTilingConfig,
)
from kerneltune.kernels._plugins import KernelPluginWarning, register_plugins
from kerneltune.kernels._spec import (
    TORCH_DTYPES,
    Inputs,
    KernelSpec,
    Outputs,
    Problem,
    compare_outputs,
    interpreting,
)
from kerneltune.table import Table

REGISTRY: dict[str, KernelSpec] = {
    spec.name: spec
    for spec in (
        rmsnorm_fwd_spec.SPEC,
        rmsnorm_bwd_spec.SPEC,
        add_rmsnorm_spec.SPEC,
        rmsnorm_quant_spec.SPEC,
    )
}
#: The kernels of the package itself, whose names no plug-in may take.
BUILTINS: frozenset[str] = frozenset(REGISTRY)


def get_spec(name: str) -> KernelSpec:
    """The spec of a kernel by name; a clear error naming the known ones otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown kernel {name!r}; known: {sorted(REGISTRY)}") from None


def running_hashes() -> dict[str, str]:
    """The kernel hash of the running source of each registered kernel."""
    return {name: spec.kernel_hash for name, spec in REGISTRY.items()}


def current_entries(table: Table) -> Table:
    """The entries of `table` measured on the running kernel source (a stale one is never
    used as an answer)."""
    hashes = running_hashes()
    return replace(table, entries=[e for e in table.entries
                                   if hashes.get(e.kernel) == e.kernel_hash])


__all__ = [
    "BUILTINS",
    "REGISTRY",
    "TORCH_DTYPES",
    "BackwardConfig",
    "ForwardConfig",
    "Inputs",
    "KernelConfig",
    "KernelPluginWarning",
    "KernelSpec",
    "Outputs",
    "Problem",
    "QuantConfig",
    "RowTilingConfig",
    "compare_outputs",
    "current_entries",
    "get_spec",
    "interpreting",
    "running_hashes",
]

# Last: a plug-in's module may import names of this package, all defined by now.
register_plugins(REGISTRY, BUILTINS)
