"""Which tuned config answers a kernel call, and why: the one rule that the runtime and the
service both apply.

`resolve` is a pure function of a kernel spec, a problem key, the running kernel hash and an
ordered list of tables: no I/O, no environment, no device. The runtime gives it the tables it
loaded (KERNELTUNE_TABLE, the machine's own, the service's, the shipped one); the service gives
it a GPU's stored results as one table. Both add the other GPUs' tables, nearest GPU first
(`rank_transfers`), for a key the GPU has no entry for. Both therefore answer every key alike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Literal

from kerneltune.table import ConfigValue, Entry, Table, m_bucket, with_same_width

if TYPE_CHECKING:
    from kerneltune.kernels import KernelConfig, KernelSpec, Problem

Match = Literal["exact", "nearest", "transfer", "default"]


@dataclass(frozen=True)
class Source:
    """A table to look in, and how an answer taken from it names it."""

    #: 'table' (KERNELTUNE_TABLE), 'service', 'cache' (the service's table cached on disk),
    #: 'shipped', or 'store' (the service's own results).
    source: str
    #: The file, URL or store the table was read from.
    origin: str | None
    table: Table | Sequence[Entry]

    @property
    def entries(self) -> Sequence[Entry]:
        return self.table.entries if isinstance(self.table, Table) else self.table

    @property
    def device(self) -> str | None:
        """The GPU the table was tuned on, where it says."""
        return self.table.device if isinstance(self.table, Table) else None


@dataclass(frozen=True)
class PassedOver:
    """A tuned entry the rule met and passed over because its config may not run at its own
    key (not merely at the shape asked about): a broken entry, named so it can be reported."""

    entry: Entry
    #: The `Source.source` and `Source.origin` of its table.
    source: str
    origin: str | None
    #: Why its config is refused, as `KernelSpec.parse` says.
    reason: str

    def __str__(self) -> str:
        return f"{entry_named(self.entry)} in {self.origin or self.source}: {self.reason}"


@dataclass(frozen=True)
class Resolution:
    """The config one call shape uses, and why."""

    kernel: str
    n: int
    dtype: str
    m_bucket: int
    config: KernelConfig
    #: The `Source.source` of the table the config came from, or 'default'.
    source: str
    match: Match
    #: The file, URL or store of the table; None for the default.
    origin: str | None = None
    #: The tuned entry behind the config; None for the default.
    entry: Entry | None = field(default=None, compare=False)
    #: Entries met before the answer whose config may not run even at their own key: broken
    #: entries the caller may want to report (the rule itself stays silent).
    passed_over: tuple[PassedOver, ...] = field(default=(), compare=False)
    #: For a `transfer`, the GPU the entry was tuned on.
    transfer_from: str | None = None

    @property
    def at_shape(self) -> bool:
        """Whether the config was tuned at this very shape (N and M bucket, in this dtype or
        the other of its width): what no other GPU's entry would come before."""
        return self.entry is not None and (self.entry.n, self.entry.m) == (self.n, self.m_bucket)

    def __str__(self) -> str:
        where = f"{self.source} {self.origin}" if self.origin else self.source
        if self.transfer_from:
            where = f"{self.transfer_from}'s table ({where})"
        tuned = ""
        if self.entry:
            other = f" {self.entry.dtype}" if self.entry.dtype != self.dtype else ""
            tuned = f" (tuned at n={self.entry.n}, m={self.entry.m}{other}: {self.entry.us:g} us)"
        return (f"{self.kernel} n={self.n} {self.dtype} m<={self.m_bucket}: {self.match} match "
                f"from {where}{tuned}: {self.config}")


def resolve(spec: KernelSpec, m: int, n: int, dtype: str, *, kernel_hash: str,
            tables: Sequence[Source], transfers: Sequence[Source] = (),
            options: Sequence[tuple[str, ConfigValue]] = ()) -> Resolution:
    """The config for `spec` on `m` rows of `n` `dtype` elements (with the kernel's `options`),
    taken from this GPU's `tables` in their order, else from other GPUs' (`transfers`, nearest
    GPU first: `rank_transfers`), and why.

    First hit wins:

    1. `exact`: an entry at this very key (kernel, dtype, N, M bucket), from the first table
       that has one;
    2. the same shape tuned in the other dtype of the same width
       (`kerneltune.table.SAME_WIDTH`), table by table;
    3. `transfer`: the same shape tuned on another GPU, in this dtype then the other of its
       width, GPU by GPU: the same kernel on a GPU of the same architecture is a closer guess
       than another shape on this one;
    4. the nearest tuned shape in this dtype, table by table (`distance`: the same N at the
       nearest M bucket, else the nearest N; ties to the larger M, then the larger N);
    5. the same in the other dtype of the same width;
    6. `default`: the kernel's heuristic.

    Steps 2, 4 and 5 are `nearest` matches. An entry measured on kernel code other than
    `kernel_hash` is stale and never used; an entry whose config cannot run this problem
    (`usable_config`) is passed over for the next candidate, at every step. Those whose config
    cannot run even at their own key are broken, not merely tuned for another shape: the
    answer lists them (`Resolution.passed_over`), for the caller to report. The problem is
    taken at the M bucket: every M of a bucket gets one answer, which both callers cache.
    """
    bucket = m_bucket(m)
    problem = spec.problem(bucket, n, dtype, **dict(options))
    dtypes = with_same_width(dtype)
    steps = ([(d, False, tables, "nearest" if i else "exact") for i, d in enumerate(dtypes)]
             + [(d, False, transfers, "transfer") for d in dtypes]
             + [(d, True, tables, "nearest") for d in dtypes])
    current = {id(t): [e for e in t.entries if e.kernel == spec.name
                       and e.kernel_hash == kernel_hash] for t in (*tables, *transfers)}
    broken: dict[int, PassedOver] = {}
    met: set[int] = set()
    for look_in, nearest, look_at, match in steps:
        for table in look_at:
            for e in _candidates(current[id(table)], look_in, n, bucket, nearest=nearest):
                config = _parsed(spec, problem, e.config)
                if not isinstance(config, str):
                    gpu = table.device if match == "transfer" else None
                    return Resolution(spec.name, n, dtype, bucket, config, table.source, match,
                                      table.origin, e, tuple(broken.values()), gpu)
                if id(e) not in met:
                    met.add(id(e))
                    own_key = (e.n, e.m, e.dtype) == (n, bucket, dtype)
                    why = config if own_key else entry_refusal(spec, e, options)
                    if why is not None:
                        broken[id(e)] = PassedOver(e, table.source, table.origin, why)
    return Resolution(spec.name, n, dtype, bucket, spec.default(problem), "default", "default",
                      passed_over=tuple(broken.values()))


def rank_transfers(device: str, compute_capability: str | None, copy_gbps: float | None,
                   others: Sequence[Source]) -> list[Source]:
    """The tables of GPUs other than `device` in the order a key without an entry of its own
    borrows from them: the same compute capability first (same architecture: the same limits
    on warps, registers and shared memory), then the nearest copy bandwidth (the kernels are
    memory-bound), then by name, so that every caller ranks alike. A GPU whose capability or
    bandwidth is unknown ranks after those known."""
    def rank(source: Source) -> tuple[bool, float, str]:
        table = source.table
        assert isinstance(table, Table), "transfer sources are whole tables"
        same = compute_capability is not None and table.compute_capability == compute_capability
        far = (abs(math.log(table.copy_gbps / copy_gbps))
               if table.copy_gbps and copy_gbps else math.inf)
        return (not same, far, table.device)

    return sorted((s for s in others if s.device != device), key=rank)


def usable_config(spec: KernelSpec, problem: Problem, config: Mapping[str, Any]
                  ) -> KernelConfig | None:
    """A table's JSON `config` as the kernel's typed config for `problem` (an older entry's
    upgraded), or None where it may not run there: the one validity check a tuned config
    passes before it is used, by the runtime and the service alike."""
    parsed = _parsed(spec, problem, config)
    return None if isinstance(parsed, str) else parsed


def _parsed(spec: KernelSpec, problem: Problem, config: Mapping[str, Any]) -> KernelConfig | str:
    """`config` as the kernel's typed config for `problem`, or why it may not run there."""
    try:
        return spec.parse(problem, config)
    except ValueError as e:  # what `parse` raises for a config that may not run on the problem
        return str(e)


def config_refusal(spec: KernelSpec, problem: Problem, config: Mapping[str, Any]) -> str | None:
    """Why a table's JSON `config` may not run on `problem` (`KernelSpec.parse`'s reason), or
    None where it may."""
    parsed = _parsed(spec, problem, config)
    return parsed if isinstance(parsed, str) else None


def entry_refusal(spec: KernelSpec | None, entry: Entry,
                  options: Sequence[tuple[str, ConfigValue]] = ()) -> str | None:
    """Why a tuned entry may not be stored, served or launched at its own key (kernel, dtype,
    N, M bucket; with the kernel's `options`), or None where it may: the one check every
    config passes wherever it enters (the service's POST, `import`, `merge`, the runtime's
    tables). `spec` is the registry's spec of `entry.kernel`; None for a kernel this code does
    not know."""
    if spec is None:
        return f"unknown kernel {entry.kernel!r}"
    try:
        problem = spec.problem(entry.m, entry.n, entry.dtype, **dict(options))
    except ValueError as e:  # a key no problem has (M or N of 0, an unknown dtype)
        return str(e)
    return config_refusal(spec, problem, entry.config)


def refused_entries(entries: Sequence[Entry], specs: Mapping[str, KernelSpec]
                    ) -> list[tuple[int, Entry, str]]:
    """(index, entry, why) of each of `entries` that may not be stored (`entry_refusal`, with
    `specs` the registry of kernels by name): what the service's POST, `import` and `merge`
    refuse."""
    found = []
    for i, e in enumerate(entries):
        why = entry_refusal(specs.get(e.kernel), e)
        if why is not None:
            found.append((i, e, why))
    return found


def entry_named(e: Entry) -> str:
    """An entry as messages name it: its key."""
    return f"{e.kernel} {e.dtype} n={e.n} m={e.m}"


def distance(e: Entry, n: int, bucket: int) -> tuple[Fraction, Fraction, int, int]:
    """How far a tuned shape is from (n, bucket), as a sort key, nearest first.

    The ratio of the Ns (1 for the same N, which thus comes first), then that of the M
    buckets: log2 distances, compared as exact fractions so that equal distances tie (for
    2048, N = 1024 and 4096 are equally near). Ties go to the larger M (a config tuned for more
    rows rarely starves a smaller grid as badly as the reverse oversubscribes), then to the
    larger N, so that the order is total and every caller picks the same entry.
    """
    return (_ratio(e.n, n), _ratio(e.m, bucket), -e.m, -e.n)


def _ratio(a: int, b: int) -> Fraction:
    return Fraction(max(a, b), min(a, b))


def _candidates(entries: Sequence[Entry], dtype: str, n: int, bucket: int, *, nearest: bool
                ) -> list[Entry]:
    """The entries of `dtype` tuned at this very shape, or all of them, nearest first."""
    mine = [e for e in entries if e.dtype == dtype]
    if nearest:
        return sorted(mine, key=lambda e: distance(e, n, bucket))
    return [e for e in mine if e.n == n and e.m == bucket]
