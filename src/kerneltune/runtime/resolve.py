"""Which launch config a kernel call uses: resolved once per process per
(kernel, N, dtype, M bucket, options), then served from a dict.

Order of precedence, first hit wins:

1. an exact entry (same kernel, dtype, N and M bucket, current kernel hash) in the table named
   by KERNELTUNE_TABLE, else the service's table (KERNELTUNE_URL), else the shipped table;
2. the same shape tuned in the other 16-bit dtype (the same bytes and arithmetic:
   `kerneltune.table.SAME_WIDTH`), in the same order of tables;
3. the nearest tuned shape in those tables, in the same order: same kernel and dtype; the same N
   at the nearest M bucket, else the nearest N; then the same in the other 16-bit dtype;
4. the kernel's default heuristic.

A config that is not valid for the actual problem is passed over at every step.

Entries tuned on other kernel code (another `kernel_hash`) are stale and never used.
"""

from __future__ import annotations

import importlib
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from kerneltune import env
from kerneltune.kernels import REGISTRY, KernelSpec
from kerneltune.kernels._spec import TORCH_DTYPES
from kerneltune.runtime.sources import LoadedTable, forget_warnings, load_sources, warn_once
from kerneltune.table import Config, ConfigValue, Entry, lookup_order, m_bucket, with_same_width

DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in TORCH_DTYPES.items()}

#: Kernel name -> spec module, for kernels not (yet) listed in the registry.
_KERNEL_MODULES = {
    "rmsnorm_fwd": "rmsnorm_fwd_spec",
    "rmsnorm_bwd": "rmsnorm_bwd_spec",
    "add_rmsnorm_fwd": "add_rmsnorm_spec",
    "rmsnorm_quant_fwd": "rmsnorm_quant_spec",
}


def spec_of(kernel: str) -> KernelSpec:
    spec = REGISTRY.get(kernel)
    if spec is None and kernel in _KERNEL_MODULES:
        spec = importlib.import_module(f"kerneltune.kernels.{_KERNEL_MODULES[kernel]}").SPEC
    if spec is None:
        known = sorted(set(REGISTRY) | set(_KERNEL_MODULES))
        raise KeyError(f"unknown kernel {kernel!r}; known: {known}")
    return spec


@dataclass(frozen=True)
class Resolution:
    """The config one call shape uses, and why."""

    kernel: str
    n: int
    dtype: str
    m_bucket: int
    config: Config
    #: 'table' (KERNELTUNE_TABLE), 'service', 'cache' (the service's table cached on disk),
    #: 'shipped' or 'default'.
    source: str
    #: 'exact', 'nearest' or 'default'.
    match: str
    #: The file or URL of the table; None for the default.
    origin: str | None = None
    #: The tuned entry behind the config; None for the default.
    entry: Entry | None = field(default=None, compare=False)

    def __str__(self) -> str:
        where = f"{self.source} {self.origin}" if self.origin else self.source
        tuned = ""
        if self.entry:
            other = f" {self.entry.dtype}" if self.entry.dtype != self.dtype else ""
            tuned = f" (tuned at n={self.entry.n}, m={self.entry.m}{other}: {self.entry.us:g} us)"
        return (f"{self.kernel} n={self.n} {self.dtype} m<={self.m_bucket}: {self.match} match "
                f"from {where}{tuned}: {self.config}")


class Resolver:
    """Loads the tables once (lazily, at the first kernel call) and resolves configs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: list[LoadedTable] | None = None
        self._usable: dict[tuple[int, str, str], list[Entry]] = {}
        #: Slow-path resolutions done; the dict in front of it keeps this at one per key.
        self.lookups = 0

    def tables(self) -> list[LoadedTable]:
        if self._tables is None:
            with self._lock:
                if self._tables is None:
                    self._tables = load_sources(env.device_name())
        return self._tables

    def _entries(self, index: int, loaded: LoadedTable, spec: KernelSpec, dtype: str
                 ) -> list[Entry]:
        """The table's current (not stale) entries for one kernel and dtype."""
        key = (index, spec.name, dtype)
        found = self._usable.get(key)
        if found is None:
            current = spec.kernel_hash
            mine = [e for e in loaded.table.entries if e.kernel == spec.name]
            stale = [e for e in mine if e.kernel_hash != current]
            if stale:
                warn_once(
                    f"stale:{loaded.origin}:{spec.name}",
                    f"kerneltune: {len(stale)} {spec.name} entries in {loaded.origin} were tuned "
                    f"on other kernel code (hash {stale[0].kernel_hash} != {current}); "
                    f"ignoring them",
                )
            found = [e for e in mine if e.kernel_hash == current and e.dtype == dtype]
            self._usable[key] = found
        return found

    def resolve(self, spec: KernelSpec, m: int, n: int, dtype: str,
                options: Sequence[tuple[str, ConfigValue]] = ()) -> Resolution:
        self.lookups += 1
        bucket = m_bucket(m)
        problem = spec.problem(max(m, 1), n, dtype, **dict(options))
        tables = self.tables()
        dtypes = with_same_width(dtype)
        usable = {d: [self._entries(i, t, spec, d) for i, t in enumerate(tables)] for d in dtypes}
        for i, (d, nearest) in enumerate(lookup_order(dtype)):
            for loaded, entries in zip(tables, usable[d], strict=True):
                for e in _candidates(entries, n, bucket, nearest=nearest):
                    config = _usable_config(spec, problem, e)
                    if config is not None:
                        return Resolution(spec.name, n, dtype, bucket, config, loaded.source,
                                          "nearest" if i else "exact", loaded.origin, e)
        return Resolution(spec.name, n, dtype, bucket, spec.default(problem), "default", "default")


def _candidates(entries: list[Entry], n: int, bucket: int, *, nearest: bool) -> list[Entry]:
    """The entries tuned at this very shape, or all of them, nearest shape first."""
    if nearest:
        return sorted(entries, key=lambda e: _distance(e, n, bucket))
    return [e for e in entries if e.n == n and e.m == bucket]


def _distance(e: Entry, n: int, bucket: int) -> tuple[bool, float, float, int]:
    """Same N first, then the nearest N (by ratio), then the nearest M bucket (larger on ties)."""
    return (e.n != n, abs(math.log2(e.n / n)), abs(math.log2(e.m / bucket)), -e.m)


def _usable_config(spec: KernelSpec, problem, entry: Entry) -> Config | None:
    try:
        config = spec.normalize(problem, entry.config)
        return config if spec.valid(problem, config) else None
    except (KeyError, ValueError, TypeError):
        return None


# ------------------------------------------------------------------ the per-process cache

_resolver = Resolver()
#: (kernel, n, torch dtype, m bucket, options) -> config; the only thing a kernel call touches.
_configs: dict[tuple, Config] = {}
_config_lock = threading.Lock()


def config_for(spec: KernelSpec, m: int, n: int, dtype: torch.dtype,
               options: tuple[tuple[str, ConfigValue], ...] = ()) -> Config:
    """The config for a call: one dict lookup after the first call for its key."""
    key = (spec.name, n, dtype, 1 if m <= 1 else 1 << (m - 1).bit_length(), options)
    config = _configs.get(key)
    if config is None:
        with _config_lock:
            config = _configs.get(key)
            if config is None:
                config = _resolver.resolve(spec, m, n, DTYPE_NAMES[dtype], options).config
                _configs[key] = config
    return config


def resolver() -> Resolver:
    return _resolver


def reset() -> None:
    """Forget loaded tables, resolved configs and issued warnings (tests, or after changing
    KERNELTUNE_* in a running process)."""
    global _resolver
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

    `x` is the activation tensor or (M, N, dtype). Options are the kernel's (e.g. offset=1.0).
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
