"""The keys the runtime resolved other than exactly, recorded per GPU: once per process per key,
written at exit or by a background timer, merged across processes, bounded, off with
KERNELTUNE_RECORD=0, and never failing a kernel call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings

import torch

import kerneltune
from kerneltune.kernels import rmsnorm_fwd_spec, running_hashes
from kerneltune.kernels._spec import compare_outputs
from kerneltune.runtime import local, record
from kerneltune.table import INTERPRETER_DEVICE

from .conftest import DEVICE, GPU, entry, kt_warnings, table

N = 32


def run_rms_norm(m: int, n: int = N, offset: float = 0.0) -> None:
    """One real kernel call, checked against the reference."""
    x, w = torch.randn(m, n, device=DEVICE), torch.randn(n, device=DEVICE)
    y = kerneltune.rms_norm(x, w, 1e-6, offset)
    assert compare_outputs([y], [rmsnorm_fwd_spec.rmsnorm_fwd_ref(x, w, 1e-6, offset)[0]]) is None


def recorded(device: str = GPU) -> dict[tuple, record.Miss]:
    return {k.key: k for k in record.read(local.misses_path(device), device).keys}


def test_keys_resolved_other_than_exactly_are_recorded_once_per_process():
    local.refresh_table(table(entry("rmsnorm_fwd", N, 4, skip=1)), running_hashes())
    run_rms_norm(3)  # exact (bucket 4)
    run_rms_norm(7)  # nearest: bucket 8
    run_rms_norm(6)  # the same key, resolved already
    run_rms_norm(7, offset=1.0)  # the same key under other options: resolved, not counted again
    x = torch.randn(1, 24, device=DEVICE)
    kerneltune.add_rms_norm(x, torch.randn_like(x), torch.randn(24, device=DEVICE))  # default
    kerneltune.explain("rmsnorm_fwd", (200, N, "float32"))  # asking is not running
    assert not local.misses_path(GPU).exists()  # nothing written before the flush
    record.flush()
    found = recorded()
    nearest_key, default_key = ("rmsnorm_fwd", "float32", N, 8), ("add_rmsnorm_fwd", "float32",
                                                                  24, 1)
    assert set(found) == {nearest_key, default_key}
    nearest, default = found[nearest_key], found[default_key]
    assert (nearest.processes, nearest.rows, nearest.match, nearest.source) == (
        1, [7], "nearest", "local")
    assert (default.processes, default.rows, default.match) == (1, [1], "default")
    record.flush()  # nothing new: nothing added
    assert recorded()[("rmsnorm_fwd", "float32", N, 8)].processes == 1


def test_a_background_timer_writes_the_notes_of_a_process_that_runs_on(monkeypatch):
    monkeypatch.setattr(record, "FLUSH_AFTER_S", 0.05)
    run_rms_norm(5)
    deadline = time.monotonic() + 10
    while not local.misses_path(GPU).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert set(recorded()) == {("rmsnorm_fwd", "float32", N, 8)}


def test_record_0_writes_nothing(monkeypatch, data_dir):
    monkeypatch.setenv(record.ENV_RECORD, "0")
    run_rms_norm(5)
    record.flush()
    assert not os.path.exists(data_dir)


def test_a_data_directory_that_cannot_be_written_fails_no_call_and_warns_once(monkeypatch,
                                                                             tmp_path):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(local.ENV_DATA_DIR, str(tmp_path / "a-file" / "data"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for m in (3, 5, 9, 17):
            run_rms_norm(m)
        record.flush()
        run_rms_norm(33)
        record.flush()
    (said,) = kt_warnings(caught)
    assert "cannot record untuned shapes" in said and "KERNELTUNE_RECORD=0" in said


def test_the_record_is_bounded_keeping_the_keys_most_processes_met(tmp_path):
    path = tmp_path / "misses.json"

    def notes(keys: range, processes: int, rows: range) -> dict:
        return {("rmsnorm_fwd", "bfloat16", n, 64): record.Miss(
            "rmsnorm_fwd", "bfloat16", n, 64, processes, list(rows), "default", "default",
            1.0, 1.0) for n in keys}

    record.write(path, GPU, notes(range(1, record.MAX_KEYS + 1), 1, range(33, 65)))
    record.write(path, GPU, notes(range(1, 51), 1, range(65, 129)))  # met twice
    record.write(path, GPU, notes(range(5000, 5050), 2, range(1, 3)))  # new, met twice
    kept = record.read(path, GPU)
    assert len(kept.keys) == record.MAX_KEYS
    by_n = {k.n: k for k in kept.keys}
    assert set(range(1, 51)) | set(range(5000, 5050)) <= set(by_n)
    assert all(len(k.rows) <= record.MAX_ROWS and k.rows == sorted(set(k.rows))
               for k in kept.keys)
    assert by_n[1].processes == 2 and set(by_n[1].rows) <= set(range(33, 129))
    assert [k.n for k in kept.ranked()][:3] == [1, 2, 3]  # most processes, then the key order


SCRIPT = """
import sys, torch, kerneltune
m = int(sys.argv[1])
kerneltune.rms_norm(torch.randn(m, 48), torch.randn(48))   # bucket 16, the row count each its own
kerneltune.rms_norm(torch.randn(2, 40), torch.randn(40))   # one key every process meets
"""


def test_eight_processes_recording_at_once_lose_nothing(data_dir):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    rows = list(range(9, 17))
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, str(m)], env=env,
                              stderr=subprocess.PIPE, text=True) for m in rows]
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-2000:]
        assert "cannot record" not in err
    path = local.misses_path(INTERPRETER_DEVICE)
    doc = json.loads(path.read_text())  # a valid file, whatever the order of the writers
    assert doc["device"] == INTERPRETER_DEVICE
    found = recorded(INTERPRETER_DEVICE)
    assert set(found) == {("rmsnorm_fwd", "float32", 48, 16), ("rmsnorm_fwd", "float32", 40, 2)}
    each, shared = found[("rmsnorm_fwd", "float32", 48, 16)], found[("rmsnorm_fwd", "float32",
                                                                     40, 2)]
    assert (each.processes, each.rows) == (8, rows)
    assert (shared.processes, shared.rows) == (8, [2])
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, path.name + ".lock"]

