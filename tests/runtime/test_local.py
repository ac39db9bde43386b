"""The machine's own tables: where they live, how a refresh merges into one, and that processes
refreshing one table at once lose nothing."""

from __future__ import annotations

import multiprocessing
from dataclasses import replace
from pathlib import Path

import pytest

from kerneltune import runtime
from kerneltune.kernels import running_hashes
from kerneltune.runtime import local, transfer
from kerneltune.table import dumps, load

from .conftest import GPU, OTHER_GPU, entry, resolution, table

N = 64


def test_the_data_directory_setting_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv(local.ENV_DATA_DIR, str(tmp_path / "own"))
    assert local.table_path(GPU) == tmp_path / "own" / "tables" / "nvidia-test-gpu-80gb.json"
    assert local.misses_path(GPU) == tmp_path / "own" / "misses" / "nvidia-test-gpu-80gb.json"
    monkeypatch.delenv(local.ENV_DATA_DIR)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert local.data_dir() == tmp_path / "xdg" / "kerneltune"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert local.data_dir() == tmp_path / "home" / ".local" / "share" / "kerneltune"


def test_a_refresh_replaces_its_keys_keeps_the_others_and_leaves_out_stale_entries():
    running = running_hashes()
    first = [entry("rmsnorm_fwd", N, m, skip=1) for m in (1, 2)]
    done = local.refresh_table(table(*first), running)
    assert (done.path, done.written, done.entries) == (local.table_path(GPU), 2, 2)

    retuned = entry("rmsnorm_fwd", N, 2, skip=2)
    stale = entry("rmsnorm_fwd", N, 4, kernel_hash="0123456789abcdef")
    done = local.refresh_table(table(retuned, stale), running)
    assert (done.written, done.entries) == (1, 2)
    held = load(local.table_path(GPU)).index()
    assert held[("rmsnorm_fwd", "float32", N, 1)] == first[0]
    assert held[("rmsnorm_fwd", "float32", N, 2)] == retuned
    assert ("rmsnorm_fwd", "float32", N, 4) not in held
    assert local.refresh_table(table(retuned), running).written == 0  # nothing new, no write

    r = resolution("rmsnorm_fwd", 2, N)
    assert (r.source, r.match, r.entry) == ("local", "exact", retuned)


def test_a_local_table_that_does_not_load_is_skipped_with_a_warning_and_replaced():
    path = local.table_path(GPU)
    path.parent.mkdir(parents=True)
    path.write_text('{"schema": 1, "device": ')
    with pytest.warns(RuntimeWarning, match="cannot use table"):
        assert resolution("rmsnorm_fwd", 1, N).source == "default"
    e = entry("rmsnorm_fwd", N, 1, skip=1)
    assert local.refresh_table(table(e), running_hashes()).entries == 1
    assert load(path).entries == [e]


def test_another_gpus_local_table_is_its_own(monkeypatch):
    """Another GPU's local table is not this GPU's: its entries come only as a transfer."""
    local.refresh_table(table(entry("rmsnorm_fwd", N, 1, skip=1), device=OTHER_GPU),
                        running_hashes())
    assert [t.device for t in local.local_tables()] == [OTHER_GPU]
    r = resolution("rmsnorm_fwd", 1, N)
    assert (r.source, r.match, r.transfer_from) == ("local", "transfer", OTHER_GPU)
    monkeypatch.setenv(transfer.ENV_TRANSFER, "0")
    runtime.reset()
    assert resolution("rmsnorm_fwd", 1, N).source == "default"


def _refresh_one(m: int) -> None:
    local.refresh_table(table(entry("rmsnorm_fwd", N, m, skip=m)), running_hashes())


def test_processes_refreshing_one_table_at_once_lose_nothing():
    buckets = [1 << i for i in range(8)]
    with multiprocessing.get_context("fork").Pool(len(buckets)) as pool:
        pool.map(_refresh_one, buckets)
    path = local.table_path(GPU)
    assert sorted(e.m for e in load(path).entries) == buckets
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_listing_and_removing_local_tables(tmp_path):
    running = running_hashes()
    mine = [entry("rmsnorm_fwd", N, 1, skip=1), entry("rmsnorm_fwd", N, 2, skip=1)]
    local.refresh_table(table(*mine), running)
    path = local.table_path(GPU)
    # a table of the running code and of older code, as a kernel change leaves it
    doc = load(path)
    path.write_text(dumps(replace(doc, entries=[doc.entries[0],
                                                replace(doc.entries[1], kernel_hash="old")])))
    broken = Path(local.data_dir() / "tables" / "broken.json")
    broken.write_text("not json")
    (listed_broken, listed) = local.local_tables()
    assert (listed_broken.table, listed_broken.device) == (None, "broken")
    assert "not JSON" in listed_broken.error
    assert (listed.device, listed.path, len(listed.table.entries)) == (GPU, path, 2)
    assert listed.current(running) == [doc.entries[0]]

    assert local.remove_table(GPU) == path and not path.exists()
    assert local.remove_table(GPU) is None
    assert local.remove_table("broken") == broken
    assert local.local_tables() == []
