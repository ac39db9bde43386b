"""Recorded misses on SQLite and PostgreSQL: reports add up, row samples stay bounded and
spread, the most-met keys are kept, tuned keys are told apart, and concurrent reporters
neither deadlock nor lose a process."""

from __future__ import annotations

import random
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kerneltune.storage import (
    MAX_MISSES,
    MISS_ROWS,
    MissReport,
    list_misses,
    record_misses,
    run_transaction,
    spread_rows,
    upsert_result,
)

from .conftest import GPU, make_entry

HASHES = {"rmsnorm_fwd": "hash-a"}


def report(n: int = 4096, m: int = 64, processes: int = 1, rows: tuple[int, ...] = (50,),
           kernel: str = "rmsnorm_fwd") -> MissReport:
    return MissReport(kernel=kernel, dtype="bfloat16", n=n, m=m, processes=processes, rows=rows)


@given(st.lists(st.integers(1, 1 << 20), max_size=200), st.integers(2, 32))
def test_spread_rows_keeps_the_ends_and_at_most_the_limit(rows, limit):
    kept = spread_rows(rows, limit)
    distinct = sorted(set(rows))
    assert kept == sorted(set(kept)) and set(kept) <= set(distinct)
    assert len(kept) == min(limit, len(distinct))
    if distinct:
        assert (kept[0], kept[-1]) == (distinct[0], distinct[-1])


def test_reports_add_up_and_rows_merge(Session):
    with Session.begin() as s:
        record_misses(s, GPU, [report(processes=2, rows=(40, 50)), report(n=5376)])
    with Session.begin() as s:
        record_misses(s, GPU, [report(processes=3, rows=(50, 60))])
    with Session() as s:
        listed = list_misses(s, GPU, HASHES)
    assert [(r.n, r.processes, r.rows) for r in listed] == [(4096, 5, [40, 50, 60]),
                                                            (5376, 1, [50])]
    assert listed[0].first_seen <= listed[0].last_seen
    assert not any(r.tuned for r in listed)


def test_rows_stay_bounded(Session):
    for start in range(0, 100, 10):
        with Session.begin() as s:
            record_misses(s, GPU, [report(rows=tuple(range(start + 33, start + 43)))])
    with Session() as s:
        (listed,) = list_misses(s, GPU, HASHES)
    assert len(listed.rows) == MISS_ROWS and (listed.rows[0], listed.rows[-1]) == (33, 132)


def test_a_current_entry_marks_its_key_tuned(Session):
    with Session.begin() as s:
        record_misses(s, GPU, [report(n=4096), report(n=5376, processes=4)])
        upsert_result(s, GPU, make_entry(n=4096, m=64))
        upsert_result(s, GPU, make_entry(n=5376, m=64, kernel_hash="older-code"))
    with Session() as s:
        every = {r.n: r.tuned for r in list_misses(s, GPU, HASHES)}
        untuned = [r.n for r in list_misses(s, GPU, HASHES, untuned_only=True)]
        elsewhere = list_misses(s, "Another GPU", HASHES)
    assert every == {4096: True, 5376: False}  # a stale entry is no tuning
    assert untuned == [5376] and elsewhere == []


def test_a_gpu_keeps_its_most_met_keys(Session):
    reports = [report(n=8 * (i + 1), processes=1 + i % 7) for i in range(MAX_MISSES + 20)]
    with Session.begin() as s:
        record_misses(s, GPU, reports)
    with Session() as s:
        listed = list_misses(s, GPU, HASHES, limit=2 * MAX_MISSES)
    assert len(listed) == MAX_MISSES
    assert [r.processes for r in listed] == sorted((r.processes for r in listed), reverse=True)
    assert min(r.processes for r in listed) >= 1 and listed[0].processes == 7


def test_concurrent_reporters_lose_nothing(Session):
    """8 threads, each reporting the same 12 keys in its own order, 5 times."""
    keys = [(n, m) for n in (1024, 2880, 5376) for m in (1, 64, 2048, 4096)]

    def reporter(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(5):
            order = rng.sample(keys, len(keys))
            run_transaction(Session, lambda s, order=order: record_misses(
                s, GPU, [report(n, m, rows=(m + seed,)) for n, m in order]))

    threads = [threading.Thread(target=reporter, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    with Session() as s:
        listed = list_misses(s, GPU, HASHES)
    assert sorted((r.n, r.m) for r in listed) == sorted(keys)
    assert all(r.processes == 40 for r in listed)


@pytest.mark.parametrize("bad", [dict(processes=0), dict(rows=(0,))])
def test_reports_are_checked_where_they_enter(bad):
    """The store takes what the API validated; the report type itself refuses nonsense."""
    with pytest.raises(ValueError):
        report(**bad)
