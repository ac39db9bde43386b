"""Which launch config a kernel call uses: resolved once per process per
(kernel, N, dtype, M bucket, options), then served from a dict.

The rule is `kerneltune.resolution.resolve`, which the service applies too, over the tables
of this GPU in this order (`load_sources`): the one named by KERNELTUNE_TABLE, the machine's
own (`local`, in the data directory), the service's (KERNELTUNE_URL, cached on disk), the
shipped one; then the other GPUs' tables it has (local and shipped, nearest GPU first; off with
KERNELTUNE_TRANSFER=0). In short: an exact entry, the same shape in the other 16-bit dtype, the
same shape tuned on the nearest other GPU (`transfer`), the nearest tuned shape whose config is
valid here, the kernel's default. Entries tuned on other kernel
code (another `kernel_hash`) are stale: never used, and warned about once per table. An entry
whose config the kernel refuses even at its own key (a parameter outside the space, of the wrong
type, missing or unknown; the constraints broken) is passed over, as the rule says, with one
warning per entry per process naming it and why.

A kernel call's key resolved other than exactly is noted where it is resolved, once per process
(`kerneltune.runtime.record`), never on a call that finds its config resolved.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from kerneltune import env
from kerneltune.kernels import REGISTRY, KernelConfig, KernelSpec, get_spec
from kerneltune.kernels._spec import TORCH_DTYPES
from kerneltune.resolution import (
    PassedOver,
    Resolution,
    Source,
    entry_named,
    rank_transfers,
    resolve,
)
from kerneltune.runtime import record
from kerneltune.runtime.sources import LoadedTable, forget_warnings, load_sources, warn_once
from kerneltune.runtime.transfer import transfer_tables
from kerneltune.table import ConfigValue

__all__ = ["DTYPE_NAMES", "FUNCTION_KERNELS", "Resolution", "Resolver", "config_for", "explain",
           "reset", "resolver", "spec_of"]

DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in TORCH_DTYPES.items()}

#: The public functions' names, as `explain` takes them, and the kernel each one resolves (its
#: forward; `rms_norm`'s backward is `rmsnorm_bwd`).
FUNCTION_KERNELS = {
    "rms_norm": "rmsnorm_fwd",
    "add_rms_norm": "add_rmsnorm_fwd",
    "rms_norm_quant": "rmsnorm_quant_fwd",
    "layer_norm": "layernorm_fwd",
    "rms_norm_group_quant": "rmsnorm_group_quant_fwd",
    "add_rms_norm_quant": "add_rmsnorm_group_quant_fwd",
}


def spec_of(kernel: str) -> KernelSpec:
    """The registered spec of `kernel`, a kernel name or a public function's name; a KeyError
    naming both lists otherwise."""
    name = FUNCTION_KERNELS.get(kernel, kernel)
    if name not in REGISTRY:
        functions = sorted(f for f, k in FUNCTION_KERNELS.items() if k in REGISTRY)
        raise KeyError(f"unknown kernel {kernel!r}; kernels: {', '.join(sorted(REGISTRY))}; "
                       f"functions: {', '.join(functions)}")
    return get_spec(name)


class Resolver:
    """Loads the tables once (lazily, at the first kernel call) and resolves configs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: The device the tables are for (set with them).
        self.device = ""
        self._tables: list[LoadedTable] | None = None
        self._sources: list[Source] = []
        #: Other GPUs' tables, nearest GPU first (read at the first key that may borrow).
        self._transfers: list[Source] | None = None
        #: Kernels whose stale entries were looked for (each table warns once per kernel).
        self._checked: set[str] = set()
        #: Slow-path resolutions done; the dict in front of it keeps this at one per key.
        self.lookups = 0

    def tables(self) -> list[LoadedTable]:
        if self._tables is None:
            with self._lock:
                if self._tables is None:
                    self.device = env.device_name()
                    loaded = load_sources(self.device)
                    self._sources = [Source(t.source, t.origin, t.table) for t in loaded]
                    self._tables = loaded
        return self._tables

    def transfers(self) -> list[Source]:
        """The other GPUs' tables, nearest GPU first: read at the first key this GPU's own
        tables have no entry for at its shape, so a process that never meets one never reads
        them."""
        if self._transfers is None:
            tables = self.tables()
            with self._lock:
                if self._transfers is None:
                    copy_gbps = next((t.table.copy_gbps for t in tables if t.table.copy_gbps),
                                     None)
                    self._transfers = rank_transfers(
                        self.device, env.compute_capability(), copy_gbps,
                        [Source(t.source, t.origin, t.table)
                         for t in transfer_tables(self.device)])
        return self._transfers

    def _warn_stale(self, spec: KernelSpec, tables: list[LoadedTable]) -> None:
        """One warning per table holding entries of `spec` tuned on other kernel code."""
        if spec.name in self._checked:
            return
        current = spec.kernel_hash
        for loaded in tables:
            stale = [e for e in loaded.table.entries
                     if e.kernel == spec.name and e.kernel_hash != current]
            if stale:
                warn_once(
                    f"stale:{loaded.origin}:{spec.name}",
                    f"kerneltune: {len(stale)} {spec.name} entries in {loaded.origin} were tuned "
                    f"on other kernel code (hash {stale[0].kernel_hash} != {current}); "
                    f"ignoring them",
                )
        self._checked.add(spec.name)

    def resolve(self, spec: KernelSpec, m: int, n: int, dtype: str,
                options: Sequence[tuple[str, ConfigValue]] = ()) -> Resolution:
        """The config of one call shape: the shared rule over this GPU's tables."""
        self.lookups += 1
        self._warn_stale(spec, self.tables())
        found = resolve(spec, m, n, dtype, kernel_hash=spec.kernel_hash, tables=self._sources,
                        options=options)
        if not found.at_shape:  # another GPU's entry at this shape comes first, if one has it
            found = resolve(spec, m, n, dtype, kernel_hash=spec.kernel_hash,
                            tables=self._sources, transfers=self.transfers(), options=options)
        for passed in found.passed_over:
            warn_refused(passed)
        return found


def warn_refused(passed: PassedOver) -> None:
    """One warning per refused entry per process: the model runs on, with the next candidate,
    but whoever wrote the table should hear of it."""
    e = passed.entry
    warn_once(
        f"refused:{passed.source}:{passed.origin}:{e.kernel}:{e.dtype}:{e.n}:{e.m}",
        f"kerneltune: passing over the entry {entry_named(e)} in "
        f"{passed.origin or passed.source}: its config is refused ({passed.reason})",
    )


# ------------------------------------------------------------------ the per-process cache

_resolver = Resolver()
#: (kernel, n, torch dtype, m bucket, options) -> config; the only thing a kernel call touches.
_configs: dict[tuple, KernelConfig] = {}
_config_lock = threading.Lock()


def config_for(spec: KernelSpec, m: int, n: int, dtype: torch.dtype,
               options: tuple[tuple[str, ConfigValue], ...] = ()) -> KernelConfig:
    """The config for a call: one dict lookup after the first call for its key."""
    key = (spec.name, n, dtype, 1 if m <= 1 else 1 << (m - 1).bit_length(), options)
    config = _configs.get(key)
    if config is None:
        with _config_lock:
            config = _configs.get(key)
            if config is None:
                found = _resolver.resolve(spec, m, n, DTYPE_NAMES[dtype], options)
                record.note(_resolver.device, found, m)
                config = found.config
                _configs[key] = config
    return config


def resolver() -> Resolver:
    return _resolver


def reset() -> None:
    """Forget loaded tables, resolved configs and issued warnings (tests, or after changing
    KERNELTUNE_* in a running process); the keys noted untuned so far are written first."""
    global _resolver
    record.flush()
    with _config_lock:
        _configs.clear()
        _resolver = Resolver()
    forget_warnings()
    from kerneltune.runtime import launch, replay

    launch.reset()
    replay.reset()


def explain(kernel: str, x: torch.Tensor | tuple[int, int, torch.dtype | str],
            **options: ConfigValue) -> Resolution:
    """Which table (or default) and config a call of `kernel` on `x` uses.

    `kernel` is a kernel's name or a public function's (`rms_norm` for `rmsnorm_fwd`, see
    `FUNCTION_KERNELS`). `x` is the activation tensor or (M, N, dtype). Options are the
    kernel's (e.g. offset=1.0). Asking is not running: the key is not recorded.
    """
    spec = spec_of(kernel)
    if isinstance(x, torch.Tensor):
        n = x.shape[-1] if x.dim() else 1
        m, dtype = (x.numel() // n if n else 0), x.dtype
    else:
        m, n, dtype = x
    name = dtype if isinstance(dtype, str) else DTYPE_NAMES.get(dtype)
    if name not in TORCH_DTYPES:
        raise TypeError(f"dtype must be one of {sorted(TORCH_DTYPES)}, got {dtype!r}")
    return _resolver.resolve(spec, m, n, name, tuple(sorted(options.items())))
