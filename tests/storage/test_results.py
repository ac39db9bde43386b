from __future__ import annotations

import multiprocessing
import random

import pytest
from sqlalchemy import event, select

from kerneltune.storage import (
    Device,
    Result,
    entries_for,
    get_result,
    list_devices,
    make_engine,
    migrate,
    results_for,
    session_factory,
    upsert_device,
    upsert_result,
    upsert_results,
    validated_entry,
)
from kerneltune.table import Env, TableError

from .conftest import GPU, make_entry


def stored(Session, **key) -> Result | None:
    with Session() as session:
        return get_result(session, GPU, key.get("kernel", "rmsnorm_fwd"),
                          key.get("dtype", "bfloat16"), key.get("n", 4096), key.get("m", 64))


def write(Session, entry, device=GPU, supersedes=None, running=None) -> bool:
    with Session.begin() as session:
        return upsert_result(session, device, entry, supersedes=supersedes,
                             running_hash=running)


def test_first_write_inserts_and_round_trips_the_entry(Session):
    entry = make_entry(10.0)
    assert write(Session, entry)
    row = stored(Session)
    assert row is not None and row.to_entry() == entry
    assert row.updated_at is not None


def test_upsert_keeps_the_faster_config(Session):
    assert write(Session, make_entry(10.0, block=1024))
    assert not write(Session, make_entry(12.0, block=2048))  # slower: kept the stored one
    assert not write(Session, make_entry(10.0, block=4096))  # a tie keeps the first
    assert stored(Session).config["BLOCK_N"] == 1024
    assert write(Session, make_entry(8.0, block=512))  # faster: replaces
    row = stored(Session)
    assert (row.us, row.config["BLOCK_N"]) == (8.0, 512)


def test_a_slower_entry_replaces_the_row_it_supersedes_and_no_other(Session):
    assert write(Session, make_entry(8.0, block=1024))  # an earlier run's time
    read = stored(Session).fingerprint
    # Timed beside 1024 and picked, 2048 replaces it though its time is above 8.0.
    assert write(Session, make_entry(9.0, block=2048), supersedes=read)
    assert (stored(Session).us, stored(Session).config["BLOCK_N"]) == (9.0, 2048)
    assert write(Session, make_entry(7.0, block=512))  # another writer, faster
    # The row named is gone: the faster one written since stays.
    assert not write(Session, make_entry(9.5, block=4096), supersedes=read)
    assert stored(Session).config["BLOCK_N"] == 512


def test_new_kernel_hash_replaces_even_when_slower(Session):
    write(Session, make_entry(5.0, kernel_hash="old"))
    assert write(Session, make_entry(9.0, kernel_hash="new", block=256))
    row = stored(Session)
    assert (row.us, row.kernel_hash, row.config["BLOCK_N"]) == (9.0, "new", 256)
    assert not write(Session, make_entry(9.5, kernel_hash="new"))


def test_an_entry_of_other_code_than_the_running_one_never_replaces_a_result(Session):
    # An import of an older table: its entry is faster, but the runtime could not use it.
    assert write(Session, make_entry(9.0, kernel_hash="running"), running="running")
    assert not write(Session, make_entry(5.0, kernel_hash="old", block=256), running="running")
    assert (stored(Session).us, stored(Session).kernel_hash) == (9.0, "running")
    # Among the running code's entries the faster one wins, as for a tuner.
    assert not write(Session, make_entry(9.5, kernel_hash="running"), running="running")
    assert write(Session, make_entry(8.0, kernel_hash="running", block=512), running="running")
    assert stored(Session).config["BLOCK_N"] == 512


def test_the_running_code_replaces_a_stale_row_and_stale_rows_stay_put(Session):
    assert write(Session, make_entry(5.0, kernel_hash="old"), running="running")  # a new key
    # Neither is of the running code: the stored one stays, though slower.
    assert not write(Session, make_entry(4.0, kernel_hash="older", block=256), running="running")
    assert stored(Session).kernel_hash == "old"
    assert write(Session, make_entry(9.0, kernel_hash="running", block=512), running="running")
    assert (stored(Session).us, stored(Session).kernel_hash) == (9.0, "running")


def test_keys_are_separate(Session):
    for i, (kernel, dtype, n, m) in enumerate(
        [("rmsnorm_fwd", "bfloat16", 4096, 64), ("rmsnorm_fwd", "float16", 4096, 64),
         ("rmsnorm_fwd", "bfloat16", 8192, 64), ("rmsnorm_fwd", "bfloat16", 4096, 128),
         ("rmsnorm_bwd", "bfloat16", 4096, 64)]
    ):
        assert write(Session, make_entry(10.0 + i, kernel=kernel, dtype=dtype, n=n, m=m))
    assert write(Session, make_entry(99.0), device="NVIDIA H200")
    with Session() as session:
        assert len(results_for(session, GPU)) == 5
        assert len(results_for(session, GPU, kernel="rmsnorm_fwd")) == 4
        assert len(results_for(session, GPU, kernel="rmsnorm_fwd", dtype="float16")) == 1
        at_4096 = results_for(session, GPU, kernel="rmsnorm_fwd", dtype="bfloat16", n=4096)
        assert [r.m for r in at_4096] == [64, 128]
        assert results_for(session, GPU, kernel_hash="other code") == []
        assert len(results_for(session, GPU, kernel_hash=make_entry(1.0).kernel_hash)) == 5
        assert [d.name for d in list_devices(session)] == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
        assert results_for(session, "unknown GPU") == []


def test_invalid_entries_are_refused_before_the_database(Session):
    for bad in (make_entry(float("nan")), make_entry(0.0), make_entry(10.0, m=48),
                make_entry(10.0, dtype="int4"), make_entry(10.0, config={})):
        with Session.begin() as session, pytest.raises(TableError):
            upsert_result(session, GPU, bad)
    with Session() as session:
        assert results_for(session, GPU) == []


def test_empty_env_reads_back_as_none(Session):
    write(Session, make_entry(10.0, env=Env()))
    assert stored(Session).to_entry().env is None
    assert validated_entry(make_entry(10.0, env=Env())).env is None


def test_upsert_device_is_idempotent_and_records_attributes(Session):
    with Session.begin() as session:
        first = upsert_device(session, GPU)
        assert upsert_device(session, GPU, compute_capability="9.0", sm_count=132,
                             copy_gbps=3010.0) == first
        assert upsert_device(session, GPU) == first  # no attributes: nothing overwritten
    with Session() as session:
        device = session.scalars(select(Device)).one()
        attributes = (device.compute_capability, device.sm_count, device.copy_gbps)
        assert attributes == ("9.0", 132, 3010.0)
        assert device.last_seen >= device.first_seen
    with Session.begin() as session, pytest.raises(ValueError):
        upsert_device(session, " ")


def test_reads_see_writes_made_in_the_same_session(Session):
    with Session.begin() as session:
        upsert_result(session, GPU, make_entry(10.0))
        assert get_result(session, GPU, "rmsnorm_fwd", "bfloat16", 4096, 64).us == 10.0
        upsert_result(session, GPU, make_entry(7.0))
        assert get_result(session, GPU, "rmsnorm_fwd", "bfloat16", 4096, 64).us == 7.0


# --------------------------------------------------------------------------- lookups


@pytest.fixture
def tuned(Session):
    """Tuned: N=4096 at M=16 and 256; N=1024 at M=64; N=16384 at M=64 (stale hash); a bf16
    and an fp16 backward entry."""
    for n, m, block, h in [(4096, 16, 1, "a"), (4096, 256, 2, "a"), (1024, 64, 3, "a"),
                           (16384, 64, 4, "old")]:
        write(Session, make_entry(10.0, n=n, m=m, block=block, kernel_hash=h))
    for dtype in ("bfloat16", "float16"):
        write(Session, make_entry(10.0, kernel="rmsnorm_bwd", dtype=dtype, kernel_hash="a"))
    return Session


def test_entries_for_is_the_devices_table_of_a_kernel(tuned):
    """What a config lookup resolves over: every entry of the kernel, stale ones and every
    dtype included, in table order, as the table format holds them."""
    with tuned() as session:
        fwd = entries_for(session, GPU, "rmsnorm_fwd")
        assert [(e.n, e.m, e.config["BLOCK_N"], e.kernel_hash) for e in fwd] == [
            (1024, 64, 3, "a"), (4096, 16, 1, "a"), (4096, 256, 2, "a"), (16384, 64, 4, "old")]
        assert fwd[0] == validated_entry(make_entry(10.0, n=1024, m=64, block=3, kernel_hash="a"))
        bwd = entries_for(session, GPU, "rmsnorm_bwd")
        assert [(e.kernel, e.dtype) for e in bwd] == [("rmsnorm_bwd", "bfloat16"),
                                                       ("rmsnorm_bwd", "float16")]
        assert entries_for(session, GPU) == bwd + fwd
        assert entries_for(session, "unknown GPU", "rmsnorm_fwd") == []
        assert entries_for(session, GPU, "layernorm_fwd") == []



@pytest.mark.parametrize(
    ("device", "kernel", "dtype", "n", "m", "kernel_hash"),
    [("unknown GPU", "rmsnorm_fwd", "bfloat16", 4096, 16, None),
     (GPU, "rmsnorm_bwd", "bfloat16", 4096, 16, None),
     (GPU, "rmsnorm_fwd", "float32", 4096, 16, None),
     (GPU, "rmsnorm_fwd", "bfloat16", 16384, 64, "a")],
)
def test_get_result_needs_the_same_device_kernel_dtype_and_code(tuned, device, kernel, dtype,
                                                                 n, m, kernel_hash):
    with tuned() as session:
        assert get_result(session, GPU, "rmsnorm_fwd", "bfloat16", 16384, 64) is not None
        assert get_result(session, device, kernel, dtype, n, m, kernel_hash=kernel_hash) is None

# --------------------------------------------------------------------------- concurrency

KEYS = [(4096, 64), (4096, 128), (8192, 64)]


def _hammer(barrier, url: str, worker: int, writes: int, queue) -> None:
    """Upsert random times for a few shared keys, one transaction each; report what was sent."""
    rng = random.Random(worker)
    engine = make_engine(url)
    Session = session_factory(engine)
    sent = []
    barrier.wait()
    for i in range(writes):
        n, m = KEYS[rng.randrange(len(KEYS))]
        us = round(rng.uniform(1.0, 100.0), 6)
        tag = worker * 100_000 + i  # names this write in the stored config
        with Session.begin() as session:
            upsert_result(session, f"GPU {worker % 2}", make_entry(us, n=n, m=m, block=tag))
        sent.append((worker % 2, n, m, us, tag))
    engine.dispose()
    queue.put(sent)


def test_concurrent_upserts_keep_the_minimum(store_url):
    migrate(store_url)
    processes, writes = 4, 60
    ctx = multiprocessing.get_context("fork")  # no open connections here to share
    barrier, queue = ctx.Barrier(processes), ctx.Queue()
    workers = [ctx.Process(target=_hammer, args=(barrier, store_url, w, writes, queue))
               for w in range(processes)]
    for w in workers:
        w.start()
    sent = [row for _ in workers for row in queue.get(timeout=120)]
    for w in workers:
        w.join(timeout=60)
    assert [w.exitcode for w in workers] == [0] * processes  # no IntegrityError, no lock error
    assert len(sent) == processes * writes

    engine = make_engine(store_url)
    with session_factory(engine)() as session:
        rows = session.scalars(select(Result)).all()
        best = {}
        for gpu, n, m, us, tag in sent:
            key = (f"GPU {gpu}", n, m)
            if key not in best or us < best[key][0]:
                best[key] = (us, tag)
        got = {(r.device.name, r.n, r.m): (r.us, r.config["BLOCK_N"]) for r in rows}
    assert got == best  # the fastest write of each key, whole (its config came with it)
    engine.dispose()


def _multi_writer(url: str, worker: int, requests: int, barrier, queue) -> None:
    """Like a POST of several entries: each transaction upserts 2-4 shared keys, in a random
    order, one entry at a time (the order a body gives them in)."""
    rng = random.Random(1000 + worker)
    engine = make_engine(url)
    Session = session_factory(engine)
    sent, errors = [], []
    barrier.wait()
    for i in range(requests):
        keys = rng.sample(MULTI_KEYS, rng.randint(2, 4))
        entries = [make_entry(round(rng.uniform(1.0, 100.0), 6), n=n, m=m,
                              block=worker * 100_000 + i) for n, m in keys]
        try:
            with Session.begin() as session:
                for entry in entries:
                    upsert_result(session, GPU, entry)
        except Exception as e:  # reported, not raised, from a child process
            errors.append(f"{type(getattr(e, 'orig', e)).__name__}")
            continue
        sent.extend((e.n, e.m, e.us, e.config["BLOCK_N"]) for e in entries)
    engine.dispose()
    queue.put((sent, errors))


MULTI_KEYS = [(n, m) for n in (1024, 2048, 4096, 8192) for m in (64, 128)]


@pytest.mark.postgres
def test_concurrent_multi_entry_writes_in_any_order_never_deadlock(pg_url):
    """Transactions writing the same keys in opposite orders used to deadlock on PostgreSQL
    (one aborted: a lost write); each now takes its device's write lock first."""
    migrate(pg_url)
    processes, requests = 8, 25
    ctx = multiprocessing.get_context("fork")
    barrier, queue = ctx.Barrier(processes), ctx.Queue()
    workers = [ctx.Process(target=_multi_writer, args=(pg_url, w, requests, barrier, queue))
               for w in range(processes)]
    for w in workers:
        w.start()
    reports = [queue.get(timeout=120) for _ in workers]
    for w in workers:
        w.join(timeout=60)
    errors = [e for _, errs in reports for e in errs]
    assert errors == []
    best: dict = {}
    for n, m, us, tag in (row for sent, _ in reports for row in sent):
        if (n, m) not in best or us < best[(n, m)][0]:
            best[(n, m)] = (us, tag)
    engine = make_engine(pg_url)
    with session_factory(engine)() as session:
        got = {(r.n, r.m): (r.us, r.config["BLOCK_N"]) for r in results_for(session, GPU)}
    engine.dispose()
    assert got == best


def test_upsert_results_writes_in_key_order_and_answers_in_the_given_order(Session, engine):
    entries = [make_entry(5.0, n=8192, m=64), make_entry(5.0, n=1024, m=128),
               make_entry(5.0, n=1024, m=64, dtype="float16"), make_entry(5.0, n=1024, m=64)]
    with Session.begin() as session:
        upsert_result(session, GPU, make_entry(1.0, n=1024, m=128))  # faster: kept
    written_keys = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO RESULTS"):
            values = context.compiled_parameters[0]
            written_keys.append((values["dtype"], values["n"], values["m"]))

    event.listen(engine, "before_cursor_execute", record)
    try:
        with Session.begin() as session:
            written = upsert_results(session, GPU, entries, copy_gbps=3000.0)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert written == [True, False, True, True]
    assert written_keys == sorted(written_keys) == [
        ("bfloat16", 1024, 64), ("bfloat16", 1024, 128), ("bfloat16", 8192, 64),
        ("float16", 1024, 64)]
    with Session() as session:
        assert {d.name: d.copy_gbps for d in list_devices(session)} == {GPU: 3000.0}
