"""Answers to config lookups, remembered per GPU for exactly one version of its results.

Every lookup reads the version of the GPU's results: the count and the sum of the 40-bit
content fingerprints the store writes with each row (what its table ETag is made of). An
answer is reused only while the version it was computed under is still the current one, so a
write is seen by the very next lookup, in every worker process.

The version is read with one statement built once: `kerneltune.storage.table_etag` gives the
same guarantee for the whole table but builds a larger statement per call (about 1.5 ms here
against 0.06 ms), which would be most of a lookup's time.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Any

from sqlalchemy import Connection, bindparam, func, select

from kerneltune.storage import Device, Result

#: Answers kept per GPU; past it the GPU's answers are dropped and computed again.
MAX_ANSWERS_PER_GPU = 4096


_results = Result.__table__
_devices = Device.__table__
_VERSION = (
    select(func.count(), func.coalesce(func.sum(_results.c.fingerprint), 0))
    .select_from(_results.join(_devices, _results.c.device_id == _devices.c.id))
    .where(_devices.c.name == bindparam("device"))
)


def results_version(connection: Connection, gpu: str) -> str:
    """A token that changes whenever a result of `gpu` is added or replaced."""
    count, total = connection.execute(_VERSION, {"device": gpu}).one()
    return f"{count}:{total}"


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
