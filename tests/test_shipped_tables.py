"""The tables shipped in the package: well-formed, named for their GPU, valid for the running
kernels, and what the runtime uses on that GPU."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from kerneltune import env, runtime
from kerneltune import table as tbl
from kerneltune.kernels import REGISTRY, current_entries
from kerneltune.runtime import sources

SHIPPED = sorted(tbl.shipped_tables_dir().glob("*.json"))


@pytest.mark.parametrize("gpu", ["NVIDIA H200", "NVIDIA H100 80GB HBM3"])
def test_there_is_a_table_for_each_hopper_gpu(gpu: str) -> None:
    assert tbl.shipped_table_path(gpu) in SHIPPED


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_table_is_well_formed(path) -> None:
    table = tbl.load(path)
    assert path == tbl.shipped_table_path(table.device)
    assert table.env.triton and table.env.torch and table.env.driver  # measured on a GPU
    assert table.copy_gbps and table.copy_gbps > 100
    for e in table.entries:
        spec = REGISTRY[e.kernel]
        problem = spec.problem(e.m, e.n, e.dtype)
        assert spec.valid(problem, spec.parse(problem, e.config)), e.key
        assert e.us <= e.default_us * 1.02, e.key  # never slower than the default beyond noise


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_entry_was_measured_on_the_running_device_code(path) -> None:
    """A stale entry (another kernel hash) is ignored on its GPU, with a warning, and its shape
    runs a neighbour's config: a change to what the GPU runs must come with a re-tuned table,
    and one that keeps it (docs, host refactors) must keep the hash."""
    stale: dict[str, set[str]] = {}
    for e in tbl.load(path).entries:
        if e.kernel_hash != REGISTRY[e.kernel].kernel_hash:
            stale.setdefault(e.kernel, set()).add(e.kernel_hash)
    assert stale == {}


@contextlib.contextmanager
def runtime_on_the_gpu_of(table: tbl.Table, monkeypatch) -> Iterator[None]:
    """The runtime as on the table's GPU, with no table named and no service."""
    for name in (sources.ENV_TABLE, sources.ENV_URL):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(env, "device_name", lambda index=None: table.device)
    runtime.reset()
    try:
        yield
    finally:
        runtime.reset()


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_runtime_uses_the_shipped_table_on_its_gpu(path, monkeypatch) -> None:
    table = tbl.load(path)
    with runtime_on_the_gpu_of(table, monkeypatch):
        for e in table.entries:
            got = runtime.explain(e.kernel, (e.m, e.n, e.dtype))
            assert (got.source, got.match) == ("shipped", "exact"), str(got)
            spec = REGISTRY[e.kernel]
            assert got.config == spec.parse(spec.problem(e.m, e.n, e.dtype), e.config)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_a_shape_tuned_in_one_16_bit_dtype_serves_the_other(path, monkeypatch) -> None:
    """The H200's table holds bf16 only: an fp16 call (the same bytes and arithmetic) runs the
    bf16 entry of its shape rather than a neighbour's or the default."""
    table = tbl.load(path)
    current = current_entries(table).entries
    tuned = {e.key for e in current}
    alone = [e for e in current if e.dtype in tbl.SAME_WIDTH
             and (e.kernel, tbl.SAME_WIDTH[e.dtype], e.n, e.m) not in tuned]
    if not alone:
        pytest.skip(f"{path.name} tunes every shape in both 16-bit dtypes")
    with runtime_on_the_gpu_of(table, monkeypatch):
        for e in alone:
            got = runtime.explain(e.kernel, (e.m, e.n, tbl.SAME_WIDTH[e.dtype]))
            assert got.source == "shipped" and got.entry == e, str(got)
