"""What a tuning job covers: kernels × dtypes × hidden sizes × M buckets on one device.

A tuning key is (device, kernel, dtype, n, m bucket). Kernels are named by their registry name or,
for kernels that live outside the package (plugins, tests), by a ``"module:attribute"`` reference
to a `KernelSpec` instance.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kerneltune import table
from kerneltune.kernels import REGISTRY, KernelSpec, Problem
from kerneltune.table import DTYPES, Config, m_bucket
from kerneltune.tuner.protocol import TIMING_MS

SAMPLERS = ("tpe", "brute", "random")

#: Hidden sizes (and MLP intermediate sizes, where fused norm + quantization kernels run on the
#: MLP activations) of common model families, from their Hugging Face configs.
MODEL_SIZES: dict[str, tuple[int, ...]] = {
    "llama3.2-1b": (2048, 8192),
    "llama3.2-3b": (3072, 8192),
    "llama3-8b": (4096, 14336),
    "llama3-70b": (8192, 28672),
    "llama3-405b": (16384, 53248),
    "mistral-7b": (4096, 14336),
    "mistral-nemo-12b": (5120, 14336),
    "qwen2.5-1.5b": (1536, 8960),
    "qwen2.5-7b": (3584, 18944),
    "qwen2.5-14b": (5120, 13824),
    "qwen2.5-32b": (5120, 27648),
    "qwen2.5-72b": (8192, 29568),
    "gemma2-2b": (2304, 9216),
    "gemma2-9b": (3584, 14336),
    "gemma2-27b": (4608, 36864),
    "gemma3-4b": (2560, 10240),
    "phi3-mini": (3072, 8192),
    "deepseek-v3": (7168, 18432, 1536, 512),  # hidden, MLP, q LoRA rank, kv LoRA rank
}

#: Hidden sizes only: the RMSNorm shapes every model runs on each layer.
COMMON_HIDDEN = (2048, 2560, 3072, 3584, 4096, 5120, 7168, 8192, 14336, 16384)

PRESETS: dict[str, tuple[int, ...]] = {
    **MODEL_SIZES,
    "common": COMMON_HIDDEN,
    "all": tuple(sorted({n for sizes in MODEL_SIZES.values() for n in sizes} | set(COMMON_HIDDEN))),
}

#: Row-count buckets: powers of two from one token (decode) to 64K tokens (long prefill).
M_BUCKETS = tuple(1 << i for i in range(17))


def preset_sizes(names: Iterable[str]) -> list[int]:
    """The sorted union of the hidden sizes of the named presets."""
    sizes: set[int] = set()
    for name in names:
        try:
            sizes.update(PRESETS[name])
        except KeyError:
            raise ValueError(f"unknown preset {name!r}; known: {', '.join(sorted(PRESETS))}"
                             ) from None
    return sorted(sizes)


def read_keys(text: str) -> list[tuple[str, str, int, int]]:
    """Keys listed as JSON, `[{"kernel": ..., "n": ..., "m": ..., "dtype": ...}, ...]` (dtype
    bfloat16 where absent, m rounded up to its bucket), as (kernel, dtype, N, M bucket).
    ValueError, naming the item, for anything else."""
    try:
        items = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"keys: not JSON ({e})") from None
    if not isinstance(items, list) or not items:
        raise ValueError('keys: a non-empty JSON list of {"kernel", "n", "m"[, "dtype"]}')
    keys = []
    for item in items:
        ok = (isinstance(item, dict) and set(item) <= {"kernel", "dtype", "n", "m"}
              and isinstance(item.get("kernel"), str) and isinstance(item.get("dtype", ""), str)
              and all(type(item.get(f)) is int and item[f] >= 1 for f in ("n", "m")))
        if not ok:
            raise ValueError(f'keys: {item!r} is not {{"kernel": name, "n": >= 1, "m": >= 1'
                             f'[, "dtype": name]}}')
        keys.append((item["kernel"], item.get("dtype", "bfloat16"), item["n"], m_bucket(item["m"])))
    return keys


def resolve_spec(ref: str) -> KernelSpec:
    """A kernel spec by registry name or by ``"module:attribute"`` reference."""
    if ":" not in ref:
        try:
            return REGISTRY[ref]
        except KeyError:
            raise ValueError(f"unknown kernel {ref!r}; known: {', '.join(sorted(REGISTRY))} "
                             "(or give a 'module:attribute' reference)") from None
    module_name, _, attr = ref.partition(":")
    try:
        spec = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot load kernel spec {ref!r}: {e}") from e
    if not isinstance(spec, KernelSpec):
        raise ValueError(f"{ref!r} is a {type(spec).__name__}, not a KernelSpec")
    return spec


@dataclass(frozen=True, order=True)
class TuneKey:
    """One tuning key; `spec_ref` says how a worker process finds the kernel's spec, `rows` the
    row counts its calls were recorded at (sorted, each in the bucket; none: unknown)."""

    device: str
    kernel: str
    dtype: str
    n: int
    m: int
    spec_ref: str = field(default="", compare=False)
    rows: tuple[int, ...] = field(default=(), compare=False)

    def problem(self) -> Problem:
        """The key's problem at the bucket's edge, M = the bucket: its space and constraints
        are those of every row count the entry serves."""
        return Problem(self.kernel, self.m, self.n, self.dtype)

    def timed_rows(self) -> tuple[int, ...]:
        """The row counts its candidates are timed at: the recorded rows' lowest, middle and
        highest (a few spread ones: each costs a timing per candidate), else the bucket's edge
        (M = the bucket)."""
        if not self.rows:
            return (self.m,)
        return tuple(sorted({self.rows[0], self.rows[len(self.rows) // 2], self.rows[-1]}))

    def __str__(self) -> str:
        return f"{self.kernel} {self.dtype} n={self.n} m={self.m}"


@dataclass
class Job:
    """A tuning job. `device` None means the device the benchmark workers run on."""

    kernels: Sequence[str]
    ns: Sequence[int]
    dtypes: Sequence[str] = ("bfloat16",)
    m_buckets: Sequence[int] = M_BUCKETS
    #: Measured candidates per key (invalid and duplicate suggestions do not count); with the
    #: brute sampler 0 means the whole space.
    trials: int = 40
    sampler: str = "tpe"
    seed: int = 0
    #: Wall-clock budget for the whole job (None: no limit).
    time_budget_s: float | None = None
    compile_timeout_s: float = 180.0
    run_timeout_s: float = 60.0
    device: str | None = None
    #: The winner is re-timed against this many runners-up (plus the default), interleaved, in
    #: `retime_rounds` rounds. Three is what the shipped tables used; over 853 H200 keys with
    #: two or more finalists, the first two rounds alone picked a winner within 0.5% of the
    #: three rounds' at all but one key (2.5%).
    retime_top: int = 3
    retime_rounds: int = 3
    #: Runners-up whose search time is more than this fraction behind the best one's are not
    #: re-timed; the default always is. Over the 251 keys of the H100 and H200 stores, 8% would
    #: have re-timed 613 finalists instead of 776, and missed the re-timed winner at 6 keys by
    #: at most 0.9% (a lucky first reading can set the best search time).
    retime_within: float = 0.08
    #: GPU time spent replaying one candidate's graph (ms; at least 10 replays): the search
    #: only ranks candidates, and the finalists' interleaved re-timing settles close calls.
    timing_ms: float = TIMING_MS
    #: Candidates asked of the sampler at a time; with `precompile` processes per benchmark
    #: worker, each batch is compiled in parallel before its candidates are timed in turn.
    batch: int = 1
    precompile: int = 0
    #: Tuned tables (another GPU's, say) whose config for a key is tried right after the
    #: default: a winner elsewhere is often a winner, or nearly, here.
    seed_tables: Sequence[str] = ()
    #: Where given, the job's keys are these (kernel name, dtype, N, M bucket) alone, not the
    #: whole product of its kernels, dtypes, sizes and buckets (each must lie in it).
    only: Sequence[tuple[str, str, int, int]] = ()
    #: The row counts the calls of a key were recorded at (the runtime's record, the service's
    #: reports), by (kernel name, dtype, N, M bucket): the key is timed at those
    #: (`TuneKey.timed_rows`) and its pick checked at the lowest; a row count outside the
    #: key's bucket is left out. A key without any is timed at M = its bucket.
    rows: Mapping[tuple[str, str, int, int], Sequence[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.kernels = list(dict.fromkeys(self.kernels))
        self.ns = sorted(set(self.ns))
        self.dtypes = list(dict.fromkeys(self.dtypes))
        self.m_buckets = sorted(set(self.m_buckets))
        if not self.kernels:
            raise ValueError("a job needs at least one kernel")
        if not self.ns:
            raise ValueError("a job needs at least one hidden size N (give --n or --preset)")
        if any(n < 1 for n in self.ns):
            raise ValueError(f"hidden sizes must be >= 1, got {self.ns}")
        if not self.dtypes or any(d not in DTYPES for d in self.dtypes):
            raise ValueError(f"dtypes must be among {DTYPES}, got {self.dtypes}")
        bad = [m for m in self.m_buckets if m < 1 or m != m_bucket(m)]
        if bad or not self.m_buckets:
            raise ValueError(f"M buckets must be powers of two >= 1, got {bad or 'none'}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {self.sampler!r}")
        if self.trials < 0 or (self.trials == 0 and self.sampler != "brute"):
            raise ValueError("trials must be >= 1 (0 = the whole space, with --sampler brute)")
        if self.compile_timeout_s <= 0 or self.run_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        if self.retime_rounds < 1 or self.retime_top < 1:
            raise ValueError("retime_rounds and retime_top must be >= 1")
        if not self.retime_within >= 0:
            raise ValueError(f"retime_within must be >= 0, got {self.retime_within}")
        if not self.timing_ms > 0:
            raise ValueError(f"timing_ms must be > 0, got {self.timing_ms}")
        if self.batch < 1 or self.precompile < 0:
            raise ValueError("batch must be >= 1 and precompile >= 0")
        self.only = sorted(set(self.only))
        self.rows = {key: tuple(sorted({r for r in rows if r >= 1 and m_bucket(r) == key[3]}))
                     for key, rows in self.rows.items()}

    def seed_configs(self) -> dict[tuple[str, str, int, int], list[Config]]:
        """(kernel, dtype, N, M bucket) -> the seed tables' configs for it (their JSON, which
        `JobRunner.neighbour_configs` reads as the kernel's configs), in table order.
        Raises OSError or `TableError` for a table that cannot be read."""
        seeds: dict[tuple[str, str, int, int], list[Config]] = {}
        for path in self.seed_tables:
            for entry in table.load(path).entries:
                seeds.setdefault(entry.key, []).append(dict(entry.config))
        return seeds

    def specs(self) -> dict[str, KernelSpec]:
        """Spec reference -> spec, for every kernel of the job."""
        return {ref: resolve_spec(ref) for ref in self.kernels}

    def keys(self, device: str) -> list[TuneKey]:
        """Every key of the job on `device` (those of `only`, where given), in a fixed order
        (kernel, dtype, n, m)."""
        product = sorted(
            TuneKey(device, spec.name, dtype, n, m, ref, self.rows.get((spec.name, dtype, n, m),
                                                                      ()))
            for ref, spec in self.specs().items()
            for dtype in self.dtypes
            for n in self.ns
            for m in self.m_buckets
        )
        if not self.only:
            return product
        chosen = [k for k in product if (k.kernel, k.dtype, k.n, k.m) in self.only]
        if len(chosen) < len(self.only):
            missing = set(self.only) - {(k.kernel, k.dtype, k.n, k.m) for k in chosen}
            raise ValueError(f"keys outside the job's kernels, dtypes, sizes and buckets: "
                             f"{sorted(missing)}")
        return chosen
