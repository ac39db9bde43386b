"""Answers to config lookups: computed by the runtime's own rule over a GPU's stored results,
and remembered per GPU for exactly one version of those results.

`config_answer` reads the GPU's entries of the kernel from the store as one table
(`store_table`) and resolves the key with `kerneltune.resolution.resolve`, the function the
runtime calls on its tables: a service and a runtime holding the same entries give the same
config, match and tuned key.

Every lookup reads the version of the GPU's results: the count and the sum of the 40-bit
content fingerprints the store writes with each row (what its table ETag is made of). An
answer is reused only while the version it was computed under is still the current one, so a
write is seen by the very next lookup, in every worker process.

The version is read with one statement built once: `kerneltune.storage.table_etag` gives the
same guarantee for the whole table but builds a larger statement per call (about 1.5 ms here
against 0.06 ms), which would be most of a lookup's time.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable, Sequence
from typing import Any

from sqlalchemy import Connection, bindparam, func, select
from sqlalchemy.orm import Session

from kerneltune.api.schemas import ConfigAnswer, Key, Measurement
from kerneltune.kernels import KernelSpec
from kerneltune.resolution import Resolution, Source, rank_transfers, resolve
from kerneltune.storage import Device, Result, entries_for, list_devices
from kerneltune.table import INTERPRETER_DEVICE, Entry, Table

#: Answers (and kernel tables) kept per GPU; past it the GPU's are dropped and computed again.
MAX_ANSWERS_PER_GPU = 4096


_results = Result.__table__
_devices = Device.__table__
_VERSION = (
    select(func.count(), func.coalesce(func.sum(_results.c.fingerprint), 0))
    .select_from(_results.join(_devices, _results.c.device_id == _devices.c.id))
    .where(_devices.c.name == bindparam("device"))
)
_OTHER_DEVICES = select(_devices).where(_devices.c.name != bindparam("device")).subquery()
_OTHERS_VERSION = select(
    select(func.count()).select_from(_results.join(
        _OTHER_DEVICES, _results.c.device_id == _OTHER_DEVICES.c.id)).scalar_subquery(),
    select(func.coalesce(func.sum(_results.c.fingerprint), 0)).select_from(_results.join(
        _OTHER_DEVICES, _results.c.device_id == _OTHER_DEVICES.c.id)).scalar_subquery(),
    select(func.coalesce(func.sum(_OTHER_DEVICES.c.copy_gbps), 0)).scalar_subquery(),
    select(func.count(_OTHER_DEVICES.c.compute_capability)).scalar_subquery(),
)


def results_version(connection: Connection, gpu: str) -> str:
    """A token that changes whenever a result of `gpu` is added or replaced."""
    count, total = connection.execute(_VERSION, {"device": gpu}).one()
    return f"{count}:{total}"


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


def transfer_sources(session: Session, device: str, kernel: str) -> list[Source]:
    """The other GPUs' stored results of `kernel`, one table each, in the order `device`
    borrows from them (`kerneltune.resolution.rank_transfers`): the interpreter's are none."""
    devices = list_devices(session)
    own = next((d for d in devices if d.name == device), None)
    others = [Source("store", d.name, Table(
                  device=d.name, copy_gbps=d.copy_gbps, compute_capability=d.compute_capability,
                  entries=entries_for(session, d.name, kernel)))
              for d in devices if d.name not in (device, INTERPRETER_DEVICE)]
    return rank_transfers(device, own and own.compute_capability, own and own.copy_gbps, others)


def others_version(connection: Connection, gpu: str) -> str:
    """A token that changes whenever a result of a GPU other than `gpu` is added or replaced,
    or another GPU's copy bandwidth or compute capability is set: what a transfer depends on."""
    count, total, bandwidths, capabilities = connection.execute(
        _OTHERS_VERSION, {"device": gpu}).one()
    return f"{count}:{total}:{bandwidths!r}:{capabilities}"


def cached_config_answer(answers: AnswersByVersion, version: str, connection: Connection,
                         session: Session, spec: KernelSpec, device: str, dtype: str, n: int,
                         bucket: int, *, transfer: bool = True) -> ConfigAnswer:
    """`config_answer` for an M bucket, computed once per version of the GPU's results, from
    the kernel's table read once per version: reading a few hundred rows costs ~10 ms,
    resolving over them ~0.1-1 ms. An answer that did not come from the GPU's own entries at
    this shape depends on the other GPUs' results too (a transfer, or none to borrow): it is
    kept with their version (`others_version`), read again only for such answers."""
    key = (spec.name, dtype, n, bucket)
    cached: tuple[ConfigAnswer, str | None] | None = answers.get(device, version, key)
    if cached is not None:
        answer, others = cached
        if others is None or others == others_version(connection, device):
            return answer
    table: Source | None = answers.get(device, version, spec.name)
    if table is None:
        table = store_table(session, device, spec.name)
        answers.put(device, version, spec.name, table)
    others = others_version(connection, device) if transfer else None
    transfers: list[Source] = []
    if others is not None:
        kept = answers.get(device, version, ("transfers", spec.name))
        if kept is not None and kept[0] == others:
            transfers = kept[1]
        else:
            transfers = transfer_sources(session, device, spec.name)
            answers.put(device, version, ("transfers", spec.name), (others, transfers))
    r = resolve(spec, bucket, n, dtype, kernel_hash=spec.kernel_hash, tables=[table],
                transfers=transfers)
    own = r.entry is not None and r.match != "transfer" and (r.entry.n, r.entry.m) == (n, bucket)
    answer = _answer(spec, r, device, bucket)
    answers.put(device, version, key, (answer, None if own else others))
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
