"""Answers to config lookups: computed by the runtime's own rule over a GPU's stored results,
and remembered per GPU for exactly one version of those results.

`config_answer` reads the GPU's entries of the kernel from the store as one table
(`store_table`) and resolves the key with `kerneltune.resolution.resolve`, the function the
runtime calls on its tables: a service and a runtime holding the same entries give the same
config, match and tuned key.

Every lookup reads the version of the GPU's results: the count and the sum of the 40-bit
content fingerprints the store writes with each row (what its table ETag is made of), and the
same of the other GPUs' results at the key's shape, which a transfer borrows from. An answer is
reused only while the versions it depends on are still the current ones, so a write is seen by
the very next lookup, in every worker process.

The versions are read with one statement built once (`versions`): `kerneltune.storage
.table_etag` gives the same guarantee for a whole table but builds a larger statement per call
(about 1.5 ms here against 0.06 ms), and a second statement per lookup cost a fifth of the
lookup rate.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, func, select
from sqlalchemy.orm import Session

from kerneltune.api.schemas import ConfigAnswer, Key, Measurement
from kerneltune.kernels import KernelSpec
from kerneltune.resolution import Resolution, Source, rank_transfers, resolve
from kerneltune.storage import Device, Result, entries_for, list_devices
from kerneltune.table import INTERPRETER_DEVICE, Entry, Table, with_same_width

#: Answers (and kernel tables) kept per GPU; past it the GPU's are dropped and computed again.
MAX_ANSWERS_PER_GPU = 4096


_results = Result.__table__
_devices = Device.__table__
_OWN = _devices.c.name == bindparam("device")
# Another GPU's result at the key's shape, in its dtype or the other of its width.
_AT_KEY = (
    (_devices.c.name != bindparam("device")) & (_results.c.kernel == bindparam("kernel"))
    & (_results.c.n == bindparam("n")) & (_results.c.m == bindparam("m"))
    & ((_results.c.dtype == bindparam("dtype")) | (_results.c.dtype == bindparam("twin")))
)
_WITH_DEVICE = _results.join(_devices, _results.c.device_id == _devices.c.id)
_VERSIONS = select(*(
    q.scalar_subquery() for q in (
        select(func.count()).select_from(_WITH_DEVICE).where(_OWN),
        select(func.coalesce(func.sum(_results.c.fingerprint), 0))
        .select_from(_WITH_DEVICE).where(_OWN),
        select(func.count()).select_from(_WITH_DEVICE).where(_AT_KEY),
        select(func.coalesce(func.sum(_results.c.fingerprint), 0))
        .select_from(_WITH_DEVICE).where(_AT_KEY),
        select(func.coalesce(func.sum(_devices.c.copy_gbps), 0)),
        select(func.count(_devices.c.compute_capability)),
    )
))


@dataclass(frozen=True)
class Versions:
    """What one lookup's answer depends on, read in one statement: `own`, a token that changes
    whenever a result of the GPU is added or replaced; `others`, one that changes whenever
    another GPU's result at the key's shape is, or a GPU's copy bandwidth or compute capability
    is set (all a transfer of the key depends on)."""

    own: str
    others: str


def versions(connection: Connection, gpu: str, kernel: str, n: int, bucket: int, dtype: str
             ) -> Versions:
    """The `Versions` of a lookup of (`kernel`, `n`, `bucket`, `dtype`) on `gpu`."""
    same_width = with_same_width(dtype)
    count, total, *others = connection.execute(_VERSIONS, {
        "device": gpu, "kernel": kernel, "n": n, "m": bucket, "dtype": dtype,
        "twin": same_width[-1]}).one()
    return Versions(f"{count}:{total}", ":".join(map(repr, others)))


def store_table(session: Session, device: str, kernel: str) -> Source:
    """`device`'s stored results of `kernel`: the one table a lookup resolves over."""
    return Source("store", device, entries_for(session, device, kernel))


def config_answer(session: Session, spec: KernelSpec, device: str, dtype: str, n: int, m: int,
                  table: Source | None = None, transfers: Sequence[Source] = ()
                  ) -> ConfigAnswer:
    """The answer of `GET /api/v1/configs/{kernel}` for `m` rows (every M of a bucket gets the
    same one, but for `m` itself), resolved over `table` (by default `store_table`), then the
    other GPUs' `transfers` (`transfer_sources`)."""
    if table is None:
        table = store_table(session, device, spec.name)
    return _answer(spec, resolve(spec, m, n, dtype, kernel_hash=spec.kernel_hash,
                                 tables=[table], transfers=transfers), device, m)


def _answer(spec: KernelSpec, r: Resolution, device: str, m: int) -> ConfigAnswer:
    found = r.entry
    return ConfigAnswer(
        kernel=spec.name, gpu=device, dtype=r.dtype, n=r.n, m=m, m_bucket=r.m_bucket,
        match=r.match, transfer_from=r.transfer_from, kernel_hash=spec.kernel_hash,
        config=r.config.to_json(),
        key=None if found is None else Key(n=found.n, m=found.m, dtype=found.dtype),
        measurement=None if found is None else _measurement(found, spec.kernel_hash),
    )


def transfer_sources(session: Session, device: str, kernel: str, n: int, bucket: int,
                     dtype: str) -> list[Source]:
    """The other GPUs' stored results at this shape (`dtype` and the other of its width: all a
    transfer looks at), one table per GPU, in the order `device` borrows from them
    (`kerneltune.resolution.rank_transfers`); the interpreter's are none."""
    devices = {d.name: d for d in list_devices(session)}
    rows = session.scalars(
        select(Result).join(Device).where(
            Device.name.not_in((device, INTERPRETER_DEVICE)), Result.kernel == kernel,
            Result.n == n, Result.m == bucket, Result.dtype.in_(with_same_width(dtype)))
        .order_by(Device.name, Result.dtype)
        .execution_options(populate_existing=True))
    entries: dict[str, list[Entry]] = {}
    for row in rows:
        entries.setdefault(row.device.name, []).append(row.to_entry())
    others = [Source("store", name, Table(device=name, copy_gbps=devices[name].copy_gbps,
                                          compute_capability=devices[name].compute_capability,
                                          entries=found))
              for name, found in entries.items()]
    own = devices.get(device)
    return rank_transfers(device, own and own.compute_capability, own and own.copy_gbps, others)


def cached_config_answer(answers: AnswersByVersion, found: Versions, session: Session,
                         spec: KernelSpec, device: str, dtype: str, n: int, bucket: int, *,
                         transfer: bool = True) -> ConfigAnswer:
    """`config_answer` for an M bucket, computed once per version of the GPU's results
    (`found.own`), from the kernel's table read once per version: reading a few hundred rows
    costs ~10 ms, resolving over them ~0.1-1 ms. An answer that did not come from the GPU's
    own entries at this shape depends on the other GPUs' entries at this shape too (one to
    borrow, or none): it is kept only as long as `found.others` stays the same."""
    key = (spec.name, dtype, n, bucket)
    cached: tuple[ConfigAnswer, str | None] | None = answers.get(device, found.own, key)
    if cached is not None and cached[1] in (None, found.others):
        return cached[0]
    table: Source | None = answers.get(device, found.own, spec.name)
    if table is None:
        table = store_table(session, device, spec.name)
        answers.put(device, found.own, spec.name, table)
    r = resolve(spec, bucket, n, dtype, kernel_hash=spec.kernel_hash, tables=[table])
    others = None
    if transfer and not r.at_shape:
        others = found.others
        r = resolve(spec, bucket, n, dtype, kernel_hash=spec.kernel_hash, tables=[table],
                    transfers=transfer_sources(session, device, spec.name, n, bucket, dtype))
    answer = _answer(spec, r, device, bucket)
    answers.put(device, found.own, key, (answer, others))
    return answer


def _measurement(entry: Entry, running_hash: str) -> Measurement:
    speedup = entry.speedup
    return Measurement(
        us=entry.us, gbps=entry.gbps, frac_copy=entry.frac_copy, default_us=entry.default_us,
        speedup=round(speedup, 4) if math.isfinite(speedup) else None, trials=entry.trials,
        kernel_hash=entry.kernel_hash, stale=entry.kernel_hash != running_hash,
    )


class AnswersByVersion:
    def __init__(self, max_per_gpu: int = MAX_ANSWERS_PER_GPU) -> None:
        self._max = max_per_gpu
        self._by_gpu: dict[str, tuple[str, dict[Hashable, Any]]] = {}
        self._lock = threading.Lock()

    def get(self, gpu: str, version: str, key: Hashable) -> Any | None:
        cached = self._by_gpu.get(gpu)
        if cached is None or cached[0] != version:
            return None
        return cached[1].get(key)

    def put(self, gpu: str, version: str, key: Hashable, answer: Any) -> None:
        """Remember `answer`, computed from the store after `version` was read (so from data at
        least as new: a write in between makes the version stale, never the answer)."""
        with self._lock:
            cached = self._by_gpu.get(gpu)
            if cached is None or cached[0] != version:
                cached = self._by_gpu[gpu] = (version, {})
            if len(cached[1]) >= self._max:
                cached[1].clear()
            cached[1][key] = answer
