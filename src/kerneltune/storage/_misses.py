"""The keys models ran untuned: recorded from the runtimes' reports, listed for tuning workers.

A report says, per key (kernel, dtype, N, M bucket), how many processes met it and some of the
row counts they met. Recording adds the processes and merges the row counts into a bounded,
spread sample (`spread_rows`); a GPU keeps at most `MAX_MISSES` keys, those met by the most
processes, then the most recently. Like every write of the store, one report's keys are written
in key order, so two reports never deadlock; nothing here commits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Table, and_, delete, exists, false, or_, select, update
from sqlalchemy.orm import Session

from kerneltune.storage._models import Device, Miss, Result, as_utc, utcnow
from kerneltune.storage._results import insert_for

_misses: Table = Miss.__table__  # type: ignore[assignment]

#: Keys kept per GPU model.
MAX_MISSES = 1000
#: Row counts kept per key.
MISS_ROWS = 16


@dataclass(frozen=True)
class MissReport:
    """One key of a runtime's report, as the store records it and a tuning worker takes it."""

    kernel: str
    dtype: str
    n: int
    m: int
    processes: int
    rows: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.n < 1 or self.m < 1 or self.m & (self.m - 1):
            raise ValueError(f"N must be positive and M a power of two, not {self.n}, {self.m}")
        if self.processes < 1 or any(r < 1 for r in self.rows):
            raise ValueError("processes and row counts must be positive")

    @property
    def key(self) -> tuple[str, str, int, int]:
        return (self.kernel, self.dtype, self.n, self.m)

    def __str__(self) -> str:
        return f"{self.kernel} {self.dtype} n={self.n} m={self.m}"


@dataclass(frozen=True)
class RecordedMiss:
    """A recorded key as listed, with whether the store now has a current entry for it."""

    kernel: str
    dtype: str
    n: int
    m: int
    processes: int
    rows: list[int]
    first_seen: datetime
    last_seen: datetime
    tuned: bool


def spread_rows(rows: Iterable[int], limit: int = MISS_ROWS) -> list[int]:
    """The distinct row counts of `rows`, sorted; past `limit`, `limit` of them spread evenly
    over the sorted range, the lowest and highest always kept (a key is tuned at its row
    counts, and checked at the lowest)."""
    distinct = sorted(set(rows))
    if len(distinct) <= limit:
        return distinct
    last = len(distinct) - 1
    return [distinct[round(i * last / (limit - 1))] for i in range(limit)]


def record_misses(session: Session, device: str, reports: Sequence[MissReport]) -> int:
    """Add `reports` to `device`'s recorded keys (in key order); the number of keys written."""
    now = utcnow()
    for report in sorted(reports, key=lambda r: r.key):
        key = dict(device=device, kernel=report.kernel, dtype=report.dtype, n=report.n,
                   m=report.m)
        rows = spread_rows(report.rows)
        stmt = insert_for(session, _misses).values(
            **key, processes=report.processes, rows=rows, first_seen=now, last_seen=now)
        stmt = stmt.on_conflict_do_update(
            index_elements=list(key),
            set_={"processes": _misses.c.processes + stmt.excluded.processes,
                  "last_seen": stmt.excluded.last_seen},
        ).returning(_misses.c.id, _misses.c.rows)
        # The upsert holds the row until commit, so merging the rows here races with no one.
        miss_id, stored = session.execute(stmt).one()
        merged = spread_rows([*stored, *rows])
        if merged != stored:
            session.execute(update(_misses).where(_misses.c.id == miss_id).values(rows=merged))
    _keep_most_met(session, device)
    return len(reports)


def _keep_most_met(session: Session, device: str) -> None:
    ranked = (select(_misses.c.id).where(_misses.c.device == device)
              .order_by(_misses.c.processes.desc(), _misses.c.last_seen.desc(),
                        _misses.c.id.desc())
              .offset(MAX_MISSES))
    extra = session.execute(ranked).scalars().all()
    if extra:
        session.execute(delete(_misses).where(_misses.c.id.in_(extra)))


def list_misses(session: Session, device: str, running_hashes: Mapping[str, str], *,
                untuned_only: bool = False, limit: int = 100) -> list[RecordedMiss]:
    """`device`'s recorded keys, met by the most processes first (then the most recently).
    A key is `tuned` once the store holds an entry for it measured on the running kernel code
    (`running_hashes`: kernel -> hash); `untuned_only` leaves those out."""
    current = or_(false(), *(and_(Result.kernel == kernel, Result.kernel_hash == digest)
                             for kernel, digest in running_hashes.items()))
    tuned = exists().where(
        Result.device_id == select(Device.id).where(Device.name == device).scalar_subquery(),
        Result.kernel == Miss.kernel, Result.dtype == Miss.dtype, Result.n == Miss.n,
        Result.m == Miss.m, current,
    )
    query = select(Miss, tuned.label("tuned")).where(Miss.device == device)
    if untuned_only:
        query = query.where(~tuned)
    query = query.order_by(Miss.processes.desc(), Miss.last_seen.desc(), Miss.id).limit(limit)
    return [
        RecordedMiss(kernel=miss.kernel, dtype=miss.dtype, n=miss.n, m=miss.m,
                     processes=miss.processes, rows=list(miss.rows),
                     first_seen=as_utc(miss.first_seen), last_seen=as_utc(miss.last_seen),
                     tuned=bool(is_tuned))
        for miss, is_tuned in session.execute(query).all()
    ]
