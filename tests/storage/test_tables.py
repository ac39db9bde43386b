from __future__ import annotations

import pytest

from kerneltune.storage import (
    UnknownDeviceError,
    export_table,
    import_table,
    make_engine,
    migrate,
    session_factory,
    start_run,
    table_etag,
    upsert_device,
    upsert_result,
)
from kerneltune.table import Env, Table, dumps, loads
from kerneltune.tuner.timing import interpreter_time

from .conftest import GPU, make_entry

ENV = Env(triton="3.6.0", torch="2.11.0+cu130", cuda="13.0", driver="580.1", python="3.12.3")


def varied_entries(count: int = 12) -> list:
    """Entries that exercise every optional field and awkward floats."""
    out = []
    kernels = ["rmsnorm_fwd", "rmsnorm_bwd", "add_rmsnorm_fwd"]
    dtypes = ["bfloat16", "float16", "float32"]
    for i in range(count):
        extra = {}
        if i % 3 == 1:
            extra = {"frac_copy": None, "default_config": None, "env": None}
        if i % 3 == 2:
            extra = {"config": {"BLOCK_N": 2 ** (i % 8 + 6), "EVICT": "first", "LOOP": True,
                                "ratio": 0.1 + i / 3}}
        out.append(make_entry(1 / 3 + i * 1.1e-7, kernel=kernels[i % 3], dtype=dtypes[i // 3 % 3],
                              n=896 * (i + 1), m=2 ** (i % 11), kernel_hash=f"h{i % 2}", **extra))
    return out


def fill(Session, entries, *, copy_gbps=3010.5) -> None:
    with Session.begin() as session:
        upsert_device(session, GPU, compute_capability="9.0", sm_count=132, copy_gbps=copy_gbps)
        run_id = start_run(session, device=GPU, env=ENV, sampler="tpe", trials_per_key=20,
                           time_budget_s=None)
        for entry in entries:
            upsert_result(session, GPU, entry, run_id=run_id)


def test_export_gives_every_result_with_device_and_run_facts(Session):
    entries = varied_entries()
    fill(Session, entries)
    with Session() as session:
        table = export_table(session, GPU)
    assert table.device == GPU and table.env == ENV and table.copy_gbps == 3010.5
    assert table.compute_capability == "9.0"
    assert table.entries == Table(GPU, entries=entries).sorted().entries


def test_round_trip_through_json_into_a_fresh_store_is_lossless(Session, tmp_path):
    fill(Session, varied_entries())
    with Session() as session:
        text = dumps(export_table(session, GPU))
        etag = table_etag(session, GPU)
    fresh = make_engine(f"sqlite:///{tmp_path / 'fresh.db'}")
    migrate(fresh)
    FreshSession = session_factory(fresh)
    with FreshSession.begin() as session:
        assert import_table(session, loads(text)) == 12
    with FreshSession() as session:
        assert dumps(export_table(session, GPU)) == text
        assert table_etag(session, GPU) == etag  # same content, same tag
    fresh.dispose()


def test_import_keeps_faster_results_and_counts_changes(Session):
    fill(Session, [make_entry(10.0, n=1024), make_entry(10.0, n=2048)])
    incoming = Table(GPU, env=Env(torch="9.9"), entries=[
        make_entry(12.0, n=1024, block=1),  # slower: kept out
        make_entry(8.0, n=2048, block=2),  # faster: replaces
        make_entry(9.0, n=4096, block=3),  # new
    ])
    with Session.begin() as session:
        assert import_table(session, incoming) == 2
    with Session() as session:
        table = export_table(session, GPU)
        got = {e.n: (e.us, e.config["BLOCK_N"]) for e in table.entries}
        assert got == {1024: (10.0, 1024), 2048: (8.0, 2), 4096: (9.0, 3)}
        assert table.env == Env(torch="9.9")  # the import is the latest run
        assert table.copy_gbps == 3010.5  # the incoming table had none
        before = table_etag(session, GPU)
    with Session.begin() as session:  # nothing new: no change, no run left behind
        assert import_table(session, incoming) == 0
    with Session() as session:
        assert table_etag(session, GPU) == before


def test_unknown_device(Session):
    with Session() as session:
        assert table_etag(session, "no such GPU") is None
        with pytest.raises(UnknownDeviceError):
            export_table(session, "no such GPU")


def test_etag_changes_exactly_when_the_table_does(Session):
    def etag():
        with Session() as session:
            return table_etag(session, GPU)

    def write(entry):
        with Session.begin() as session:
            return upsert_result(session, GPU, entry)

    write(make_entry(10.0))
    tags = [etag()]
    assert etag() == tags[-1]
    assert not write(make_entry(11.0))  # refused: table unchanged
    assert etag() == tags[-1]
    for change in (
        lambda: write(make_entry(9.0)),  # faster result
        lambda: write(make_entry(9.5, kernel_hash="other")),  # new kernel code
        lambda: write(make_entry(9.0, n=8192)),  # new key
    ):
        assert change()
        tags.append(etag())
    with Session.begin() as session:
        upsert_device(session, GPU, copy_gbps=3333.0)
    tags.append(etag())
    with Session.begin() as session:
        upsert_device(session, GPU, compute_capability="9.0")
    tags.append(etag())
    with Session.begin() as session:
        start_run(session, device=GPU, env=Env(torch="next"), sampler="tpe", trials_per_key=1,
                  time_budget_s=None)
    tags.append(etag())
    assert len(set(tags)) == len(tags)
    with Session.begin() as session:  # another device's writes leave this tag alone
        upsert_result(session, "NVIDIA H200", make_entry(1.0))
    assert etag() == tags[-1]


def test_etag_is_cheap_for_a_full_table(Session):
    entries = [make_entry(5.0 + i, n=128 * (i // 12 + 1), m=2 ** (i % 12)) for i in range(1500)]
    with Session.begin() as session:
        assert import_table(session, Table(GPU, env=ENV, entries=entries)) == 1500
    with Session() as session:
        # The tuner's wall-clock timer: a warm-up call, then the median of the repeats.
        etag_us = interpreter_time(lambda: table_etag(session, GPU), repeats=30).median_us
        export_us = interpreter_time(lambda: export_table(session, GPU), repeats=5).median_us
    # The tag exists so a client can skip the export: measured against the export on the same
    # machine at the same moment, a load that slows both leaves their ratio (0.7-1.2 ms against
    # 33-42 on an idle machine, SQLite and PostgreSQL).
    assert etag_us < export_us / 10, (etag_us, export_us)
