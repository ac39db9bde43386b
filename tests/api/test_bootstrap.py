"""`prepare_database`: what `kerneltune serve` does to a store before it serves it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kerneltune.api.bootstrap import prepare_database, shipped_tables
from kerneltune.kernels import current_entries
from kerneltune.storage import (
    export_table,
    is_migrated,
    make_engine,
    session_factory,
    upsert_result,
)
from kerneltune.table import Table, save

from .live import GPU, STALE_HASH, seeded_entry


def current_and_stale() -> Table:
    return Table(device=GPU, copy_gbps=3000.0, entries=[
        seeded_entry(4096, 64, us=5.0),
        seeded_entry(2048, 64, us=5.0, kernel_hash=STALE_HASH),
    ])


def stored(url: str, device: str = GPU) -> dict:
    engine = make_engine(url)
    try:
        with session_factory(engine)() as session:
            return {e.key: e for e in export_table(session, device).entries}
    finally:
        engine.dispose()


@pytest.fixture
def tables_dir(tmp_path):
    directory = tmp_path / "tables"
    save(current_and_stale(), directory / "nvidia-h100-80gb-hbm3.json")
    (directory / "broken.json").write_text("{not a table")
    return directory


def test_migrates_and_loads_current_entries_once(sqlite_url, tables_dir):
    assert prepare_database(sqlite_url, tables_dir=tables_dir) == 1  # the store was empty
    engine = make_engine(sqlite_url)
    assert is_migrated(engine)
    engine.dispose()
    assert list(stored(sqlite_url)) == [("rmsnorm_fwd", "bfloat16", 4096, 64)]  # stale left out
    assert prepare_database(sqlite_url, tables_dir=tables_dir, load_shipped=True) == 0


def test_a_store_of_its_own_is_loaded_only_while_empty(sqlite_url, tables_dir):
    assert prepare_database(sqlite_url, tables_dir=tables_dir, load_shipped=False) == 0
    engine = make_engine(sqlite_url)
    with session_factory(engine).begin() as session:
        upsert_result(session, "Some GPU", seeded_entry(1024, 1))
    engine.dispose()
    assert prepare_database(sqlite_url, tables_dir=tables_dir) == 0
    with pytest.raises(LookupError):
        stored(sqlite_url)  # GPU never loaded


def test_the_default_store_is_always_loaded(tmp_path, tables_dir, monkeypatch):
    monkeypatch.delenv("KERNELTUNE_DATABASE_URL", raising=False)
    monkeypatch.delenv("KERNELTUNE_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    prepare_database(None, tables_dir=tables_dir, load_shipped=False)
    url = f"sqlite:///{tmp_path / 'data' / 'kerneltune' / 'kerneltune.db'}"
    engine = make_engine(url)
    with session_factory(engine).begin() as session:
        upsert_result(session, "Some GPU", seeded_entry(1024, 1))
    engine.dispose()
    assert prepare_database(None, tables_dir=tables_dir) == 1
    assert ("rmsnorm_fwd", "bfloat16", 4096, 64) in stored(url)


def test_a_stale_shipped_entry_never_replaces_a_current_result(sqlite_url, tables_dir):
    prepare_database(sqlite_url, load_shipped=False)
    engine = make_engine(sqlite_url)
    mine = seeded_entry(2048, 64, us=9.0)  # tuned here, on the running code; slower
    with session_factory(engine).begin() as session:
        upsert_result(session, GPU, mine)
    engine.dispose()
    prepare_database(sqlite_url, tables_dir=tables_dir, load_shipped=True)
    assert stored(sqlite_url)[mine.key].us == 9.0


def test_current_entries_and_the_shipped_tables(tables_dir):
    table = current_and_stale()
    assert current_entries(table) == replace(table, entries=table.entries[:1])
    assert [t.device for t in shipped_tables(tables_dir)] == [GPU]  # the broken file skipped
    # The package's own tables load, whatever they hold today.
    for shipped in shipped_tables():
        assert shipped.device
