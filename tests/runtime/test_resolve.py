"""Config resolution: each source in its order, each failure falling back with one warning."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import kerneltune
from kerneltune import env, runtime
from kerneltune import resolution as rule
from kerneltune.kernels import REGISTRY, rmsnorm_fwd_spec, running_hashes
from kerneltune.kernels._spec import compare_outputs
from kerneltune.runtime import local, sources, transfer
from kerneltune.runtime.resolve import spec_of
from kerneltune.table import INTERPRETER_DEVICE, dumps

from .conftest import (
    DEVICE,
    GPU,
    OTHER_GPU,
    entry,
    kt_warnings,
    resolution,
    table,
    write_shipped,
)

N, M = 64, 8


def default_config(m: int = M, n: int = N, dtype: str = "float32") -> dict:
    spec = rmsnorm_fwd_spec.SPEC
    return spec.default(spec.problem(m, n, dtype, offset=0.0))


def check_outputs_correct(m: int = M, n: int = N) -> None:
    """rms_norm with whatever config was resolved matches the float64 reference."""
    g = torch.Generator().manual_seed(m * 1000 + n)
    x, w = (torch.randn(*shape, generator=g).to(DEVICE) for shape in ((m, n), (n,)))
    y = kerneltune.rms_norm(x, w, 1e-6)
    assert compare_outputs([y], [rmsnorm_fwd_spec.rmsnorm_fwd_ref(x, w, 1e-6)[0]]) is None


def test_default_when_nothing_is_configured():
    r = resolution("rmsnorm_fwd", M, N, offset=0.0)
    assert (r.source, r.match, r.origin, r.entry) == ("default", "default", None, None)
    assert r.config == default_config()
    check_outputs_correct()


def test_env_table_file_exact_entry(tmp_path, monkeypatch):
    e = entry("rmsnorm_fwd", N, M)
    path = tmp_path / "t.json"
    path.write_text(dumps(table(e)))
    monkeypatch.setenv(sources.ENV_TABLE, str(path))
    r = resolution("rmsnorm_fwd", M, N)
    assert (r.source, r.match, r.origin) == ("table", "exact", str(path))
    spec = rmsnorm_fwd_spec.SPEC
    assert r.config == spec.parse(spec.problem(M, N, "float32"), e.config)
    assert r.config != default_config()
    check_outputs_correct()


def test_the_other_16_bit_dtype_stands_in_for_an_untuned_one(tmp_path, monkeypatch):
    twin = entry("rmsnorm_fwd", N, 16, "bfloat16", skip=3)
    own_far = entry("rmsnorm_fwd", N, 1024, "float16", skip=4)
    path = tmp_path / "t.json"
    path.write_text(dumps(table(twin, own_far)))
    monkeypatch.setenv(sources.ENV_TABLE, str(path))
    # fp16 at the shape tuned in bf16: that entry, before fp16's own at another M bucket
    r = resolution("rmsnorm_fwd", 16, N, "float16")
    assert (r.source, r.match, r.entry) == ("table", "nearest", twin)
    assert "bfloat16" in str(r)
    # bf16 at the shape tuned in fp16 only: the fp16 entry
    r = resolution("rmsnorm_fwd", 1024, N, "bfloat16")
    assert (r.match, r.entry) == ("nearest", own_far)
    # a shape tuned in neither: the nearest in its own dtype comes first
    assert resolution("rmsnorm_fwd", 512, N, "float16").entry == own_far
    # each dtype's own key stays exact
    assert resolution("rmsnorm_fwd", 9, N, "bfloat16").match == "exact"
    # fp32 has no dtype of its width to borrow from
    assert resolution("rmsnorm_fwd", 16, N, "float32").match == "default"


def test_env_table_directory_picks_this_gpus_file(tmp_path, monkeypatch):
    other = entry("rmsnorm_fwd", N, M, skip=1)
    mine = entry("rmsnorm_fwd", N, M, skip=2)
    (tmp_path / "other.json").write_text(dumps(table(other, device=OTHER_GPU)))
    (tmp_path / "zz-mine.json").write_text(dumps(table(mine)))
    monkeypatch.setenv(sources.ENV_TABLE, str(tmp_path))
    r = resolution("rmsnorm_fwd", M, N)
    assert (r.source, r.origin) == ("table", str(tmp_path / "zz-mine.json"))
    assert r.entry.config == mine.config


def test_m_is_bucketed_and_nearest_shape_is_used(tmp_path, monkeypatch):
    near = entry("rmsnorm_fwd", N, 16, skip=3)
    far = entry("rmsnorm_fwd", N, 1024, skip=4)
    other_n = entry("rmsnorm_fwd", 128, 8, skip=5)
    path = tmp_path / "t.json"
    path.write_text(dumps(table(near, far, other_n)))
    monkeypatch.setenv(sources.ENV_TABLE, str(path))
    # M = 9..16 is bucket 16: exact
    exact = resolution("rmsnorm_fwd", 9, N)
    assert (exact.match, exact.m_bucket, exact.entry.m) == ("exact", 16, 16)
    # M = 64: same N, nearest bucket is 16 (64/16 = 4 beats 1024/64 = 16)
    nearest = resolution("rmsnorm_fwd", 64, N)
    assert (nearest.match, nearest.entry.m, nearest.entry.n) == ("nearest", 16, N)
    # another N, same dtype: the nearest N whose config is valid for this N
    n = 96
    r = resolution("rmsnorm_fwd", 8, n)
    assert r.match in ("nearest", "default")
    if r.match == "nearest":
        spec = rmsnorm_fwd_spec.SPEC
        assert spec.valid(spec.problem(8, n, "float32"), r.config)
    # another dtype: nothing tuned
    assert resolution("rmsnorm_fwd", 8, N, "float16").match == "default"
    check_outputs_correct(64, N)


def test_precedence_table_then_local_then_service_then_shipped(tmp_path, monkeypatch, served,
                                                               shipped_dir):
    in_file = entry("rmsnorm_fwd", N, M, skip=1)
    in_local = entry("rmsnorm_fwd", N, 2 * M, skip=2)
    in_service = entry("rmsnorm_fwd", N, 4 * M, skip=3)
    in_shipped = entry("rmsnorm_fwd", N, 8 * M, skip=4)
    path = tmp_path / "t.json"
    path.write_text(dumps(table(in_file)))
    monkeypatch.setenv(sources.ENV_TABLE, str(path))
    local.refresh_table(table(in_local, entry("rmsnorm_fwd", N, M, skip=5)), running_hashes())
    served.serve(table(in_service, entry("rmsnorm_fwd", N, 2 * M, skip=6)))
    monkeypatch.setenv(sources.ENV_URL, served.url)
    write_shipped(shipped_dir, table(in_shipped, entry("rmsnorm_fwd", N, 4 * M, skip=7)))
    assert resolution("rmsnorm_fwd", M, N).source == "table"
    r = resolution("rmsnorm_fwd", 2 * M, N)
    assert (r.source, r.match, r.origin) == ("local", "exact", str(local.table_path(GPU)))
    assert r.entry.config == in_local.config
    assert resolution("rmsnorm_fwd", 4 * M, N).source == "service"
    r = resolution("rmsnorm_fwd", 8 * M, N)
    assert (r.source, r.match, r.entry.config) == ("shipped", "exact", in_shipped.config)
    # no exact entry anywhere: the nearest shape of the first table
    assert (resolution("rmsnorm_fwd", 64 * M, N).source,
            resolution("rmsnorm_fwd", 64 * M, N).match) == ("table", "nearest")
    assert len(served.requests) == 1  # fetched once per process


def test_service_table_cached_and_revalidated_with_etag(monkeypatch, served):
    e = entry("rmsnorm_fwd", N, M)
    served.serve(table(e), etag='"abc"')
    monkeypatch.setenv(sources.ENV_URL, served.url)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        r = resolution("rmsnorm_fwd", M, N)
        check_outputs_correct()
    assert (r.source, r.match, r.origin) == ("service", "exact", sources.table_url(served.url, GPU))
    assert kt_warnings(record) == []
    paths = sources.cache_paths(sources.table_url(served.url, GPU), GPU)
    assert paths.table.read_bytes() == served.body and paths.etag.read_text() == '"abc"'
    assert served.requests == [(GPU, None)]

    runtime.reset()  # a new process: revalidate, 304, use the cache
    r2 = resolution("rmsnorm_fwd", M, N)
    assert served.requests[-1] == (GPU, '"abc"')
    assert (r2.source, r2.config) == ("service", r.config)

    runtime.reset()  # the table changed on the service: new body, new ETag
    e2 = entry("rmsnorm_fwd", N, M, skip=7)
    served.serve(table(e2), etag='"def"')
    r3 = resolution("rmsnorm_fwd", M, N)
    assert r3.entry.config == e2.config and paths.etag.read_text() == '"def"'


@pytest.mark.parametrize("failure", ["refused", "500", "garbage", "slow", "other-gpu"])
def test_service_failures_fall_back_with_one_warning(failure, monkeypatch, served, refused_url,
                                                     shipped_dir):
    shipped_entry = entry("rmsnorm_fwd", N, M, skip=2)
    write_shipped(shipped_dir, table(shipped_entry))
    served.serve(table(entry("rmsnorm_fwd", N, M, skip=1), device=OTHER_GPU))
    if failure in ("500", "garbage", "slow"):
        served.mode = failure
    monkeypatch.setattr(sources, "SERVICE_TIMEOUT_S", 0.5)
    monkeypatch.setattr(sources.service_table, "__defaults__", (None, 0.5))
    monkeypatch.setenv(sources.ENV_URL, refused_url if failure == "refused" else served.url)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        r = resolution("rmsnorm_fwd", M, N)
        for m in (1, M):
            check_outputs_correct(m, N)
        resolution("rmsnorm_fwd", 3 * M, N)
    assert (r.source, r.entry.config) == ("shipped", shipped_entry.config)
    messages = kt_warnings(record)
    assert len(messages) == 1, messages
    assert "config service" in messages[0] or OTHER_GPU in messages[0]


def test_service_down_uses_the_cached_copy(monkeypatch, served, refused_url):
    e = entry("rmsnorm_fwd", N, M)
    served.serve(table(e))
    monkeypatch.setenv(sources.ENV_URL, served.url)
    assert resolution("rmsnorm_fwd", M, N).source == "service"
    runtime.reset()
    served.mode = "500"
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        r = resolution("rmsnorm_fwd", M, N)
    assert (r.source, r.entry.config) == ("cache", e.config)
    assert len(kt_warnings(record)) == 1 and "cached copy" in kt_warnings(record)[0]


def test_corrupt_cache_file_is_ignored_and_refetched(monkeypatch, served):
    e = entry("rmsnorm_fwd", N, M)
    served.serve(table(e), etag='"v9"')
    monkeypatch.setenv(sources.ENV_URL, served.url)
    paths = sources.cache_paths(sources.table_url(served.url, GPU), GPU)
    paths.table.parent.mkdir(parents=True)
    paths.table.write_text('{"schema": 1, "entr')
    paths.etag.write_text('"v9"')
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        r = resolution("rmsnorm_fwd", M, N)
        check_outputs_correct()
    assert (r.source, r.entry.config) == ("service", e.config)
    assert served.requests == [(GPU, None)]  # no If-None-Match for a cache it cannot read
    assert len(kt_warnings(record)) == 1 and "unreadable" in kt_warnings(record)[0]
    assert json.loads(paths.table.read_text())["device"] == GPU  # repaired


def test_table_for_another_gpu_is_skipped(tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    path.write_text(dumps(table(entry("rmsnorm_fwd", N, M), device=OTHER_GPU)))
    monkeypatch.setenv(sources.ENV_TABLE, str(path))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        r = resolution("rmsnorm_fwd", M, N)
        check_outputs_correct()
        check_outputs_correct(2 * M)
    assert r.source == "default"
    assert len(kt_warnings(record)) == 1 and OTHER_GPU in kt_warnings(record)[0]


def test_corrupt_table_file_is_skipped(tmp_path, monkeypatch, shipped_dir):
    path = tmp_path / "t.json"
    path.write_text("not json at all")
    monkeypatch.setenv(sources.ENV_TABLE, str(path))
    e = entry("rmsnorm_fwd", N, M)
    write_shipped(shipped_dir, table(e))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        r = resolution("rmsnorm_fwd", M, N)
        check_outputs_correct()
    assert (r.source, r.entry.config) == ("shipped", e.config)
    assert len(kt_warnings(record)) == 1


def test_stale_kernel_hash_is_skipped(tmp_path, monkeypatch, shipped_dir):
    stale = entry("rmsnorm_fwd", N, M, kernel_hash="0" * 16, skip=1)
    current = entry("rmsnorm_fwd", N, 4 * M, skip=2)
    path = tmp_path / "t.json"
    path.write_text(dumps(table(stale, current)))
    monkeypatch.setenv(sources.ENV_TABLE, str(path))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        r = resolution("rmsnorm_fwd", M, N)
        check_outputs_correct()
        check_outputs_correct(2 * M)
    assert (r.source, r.match, r.entry.config) == ("table", "nearest", current.config)
    messages = kt_warnings(record)
    assert len(messages) == 1 and "other kernel code" in messages[0]


def test_only_stale_entries_give_the_default(tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    path.write_text(dumps(table(entry("rmsnorm_fwd", N, M, kernel_hash="f" * 16))))
    monkeypatch.setenv(sources.ENV_TABLE, str(path))
    with pytest.warns(runtime.KerneltuneWarning, match="other kernel code"):
        assert resolution("rmsnorm_fwd", M, N).source == "default"


def test_resolution_happens_once_per_key(tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    path.write_text(dumps(table(entry("rmsnorm_fwd", N, M))))
    monkeypatch.setenv(sources.ENV_TABLE, str(path))
    x, w = torch.randn(M, N, device=DEVICE), torch.randn(N, device=DEVICE)
    kerneltune.rms_norm(x, w)
    before = runtime.resolver().lookups
    assert before == 1
    for m in (5, 6, 7, 8):  # the same M bucket
        kerneltune.rms_norm(torch.randn(m, N, device=DEVICE), w)
    assert runtime.resolver().lookups == before
    kerneltune.rms_norm(torch.randn(9, N, device=DEVICE), w)  # a new bucket
    assert runtime.resolver().lookups == before + 1


def test_explain_takes_a_tensor_and_names_the_source(tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    path.write_text(dumps(table(entry("rmsnorm_fwd", N, M))))
    monkeypatch.setenv(sources.ENV_TABLE, str(path))
    r = runtime.explain("rmsnorm_fwd", torch.randn(2, 3, N))
    assert (r.m_bucket, r.n, r.dtype, r.source) == (8, N, "float32", "table")
    text = str(r)
    assert "exact" in text and str(path) in text and "BLOCK_N" in text
    with pytest.raises(KeyError, match="unknown kernel"):
        runtime.explain("no_such_kernel", (1, N, "float32"))
    with pytest.raises(TypeError, match="dtype"):
        runtime.explain("rmsnorm_fwd", (1, N, torch.int32))


def test_the_runtime_applies_the_shared_rule():
    """Specs come from the registry; the resolution is `kerneltune.resolution`'s, taken at the
    M bucket, so every M of a bucket gets what the per-process cache serves it."""
    assert all(spec_of(name) is spec for name, spec in REGISTRY.items())
    with pytest.raises(KeyError, match=f"kernels: {', '.join(sorted(REGISTRY))};"):
        spec_of("no_such_kernel")
    assert runtime.Resolution is rule.Resolution
    n = 40000  # a long row, split over programs below a count of rows
    assert default_config(33, n) != default_config(64, n)
    assert resolution("rmsnorm_fwd", 33, n) == resolution("rmsnorm_fwd", 64, n)
    assert resolution("rmsnorm_fwd", 33, n).config == default_config(64, n)


def test_explain_takes_the_public_functions_names():
    x = torch.randn(3, N)
    for function, kernel in (("rms_norm", "rmsnorm_fwd"), ("add_rms_norm", "add_rmsnorm_fwd"),
                             ("rms_norm_quant", "rmsnorm_quant_fwd")):
        assert runtime.explain(function, x).kernel == kernel
        assert runtime.explain(function, x) == runtime.explain(kernel, x)
    with pytest.raises(KeyError) as refused:
        runtime.explain("rmsnorm", x)
    said = str(refused.value)
    assert "'rmsnorm'" in said and "rmsnorm_fwd" in said and "rms_norm_quant" in said


def test_every_kernel_resolves(tmp_path, monkeypatch):
    entries = [entry(k, N, M) for k in ("rmsnorm_fwd", "rmsnorm_bwd", "add_rmsnorm_fwd")]
    path = tmp_path / "t.json"
    path.write_text(dumps(table(*entries)))
    monkeypatch.setenv(sources.ENV_TABLE, str(path))
    for e in entries:
        r = resolution(e.kernel, M, N)
        assert (r.source, r.match) == ("table", "exact"), e.kernel
        spec = spec_of(e.kernel)
        assert r.config == spec.parse(spec.problem(M, N, "float32"), e.config)


def test_real_service_over_a_seeded_sqlite_store(tmp_path, monkeypatch):
    """`kerneltune.api.create_app` under uvicorn, as `kerneltune serve` runs it."""
    pytest.importorskip("fastapi")
    from kerneltune.api.app import create_app
    from kerneltune.api.settings import Settings
    from kerneltune.storage import import_table, make_engine, migrate, session_factory

    from .conftest import UvicornThread

    url = f"sqlite:///{tmp_path / 'store.db'}"
    e = entry("rmsnorm_fwd", N, M, skip=3)
    engine = make_engine(url)
    migrate(engine)
    with session_factory(engine).begin() as session:
        import_table(session, table(e))
    engine.dispose()
    with UvicornThread(create_app(Settings(database_url=url))) as server:
        monkeypatch.setenv(sources.ENV_URL, server.url)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            r = resolution("rmsnorm_fwd", M, N)
            check_outputs_correct()
        assert (r.source, r.match, r.entry.config) == ("service", "exact", e.config)
        assert kt_warnings(record) == []
        paths = sources.cache_paths(sources.table_url(server.url, GPU), GPU)
        etag = paths.etag.read_text()
        assert etag.startswith('"')
        runtime.reset()  # next process: revalidated (304), served from the cache
        assert resolution("rmsnorm_fwd", M, N).entry.config == e.config
        assert paths.etag.read_text() == etag
    runtime.reset()  # the service gone: the cached copy, one warning
    with pytest.warns(runtime.KerneltuneWarning, match="cached copy"):
        assert resolution("rmsnorm_fwd", M, N).source == "cache"


# ------------------------------------------------------------------- refused entries


def _with(config: dict, **changes) -> dict:
    return {**config, **changes}


@pytest.mark.parametrize("changes, named", [
    ({"ROWS": -1}, "ROWS=-1"),  # once launched as it was: uninitialized rows, as `exact`
    ({"ROWS": 0}, "ROWS=0"),  # once a ZeroDivisionError inside rms_norm
    ({"num_warps": 0}, "num_warps=0"),
    ({"BLOCK_N": "64"}, "BLOCK_N='64'"),
    ({"BLOCK_N": 64.0}, "BLOCK_N=64.0"),
    ({"num_warps": 3}, "num_warps=3"),
    ({"SINGLE": "false"}, "SINGLE='false'"),
    ({"NOT_A_PARAMETER": 1}, "NOT_A_PARAMETER"),
])
def test_a_refused_entry_is_passed_over_with_one_warning_naming_it(
        changes, named, tmp_path, monkeypatch, shipped_dir):
    """An entry at the call's very key whose config its kernel refuses: passed over for the
    next candidate (here the shipped table's), with one warning naming the entry, its table
    and why; the call's output is right. Met again by another key, it is not warned twice."""
    good = entry("rmsnorm_fwd", N, M)
    bad = entry("rmsnorm_fwd", N, M, config=_with(good.config, **changes))
    path = tmp_path / "t.json"
    path.write_text(dumps(table(bad)))
    monkeypatch.setenv(sources.ENV_TABLE, str(path))
    shipped = entry("rmsnorm_fwd", N, M, skip=1)
    write_shipped(shipped_dir, table(shipped))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        r = resolution("rmsnorm_fwd", M, N)
        check_outputs_correct()
        again = resolution("rmsnorm_fwd", 4 * M, N)  # meets it among the nearest shapes
        check_outputs_correct(4 * M)
    assert (r.source, r.match, r.entry) == ("shipped", "exact", shipped)
    assert again.entry == shipped and [p.entry for p in again.passed_over] == [bad]
    (message,) = kt_warnings(record)
    for part in ("rmsnorm_fwd", "float32", f"n={N}", f"m={M}", str(path), named):
        assert part in message, part


def test_refused_entries_of_every_source_are_each_warned_once(monkeypatch, served):
    """The service's table and its disk cache go through the same check: each refused entry
    met is named once (the first key meets both, the exact one and then the nearest; the
    second key meets them again), with the source it came from, and the calls still compute
    the right answer."""
    bad_fwd = entry("rmsnorm_fwd", N, M, config={"BLOCK_N": 1024})  # incomplete
    good = entry("rmsnorm_fwd", N, M)
    bad_far = entry("rmsnorm_fwd", N, 2 * M, config=_with(good.config, GRID_MULT=0))
    served.serve(table(bad_fwd, bad_far))
    monkeypatch.setenv(sources.ENV_URL, served.url)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        r = resolution("rmsnorm_fwd", M, N)
        check_outputs_correct()
        resolution("rmsnorm_fwd", 2 * M, N)
        check_outputs_correct(2 * M)
    assert r.source == "default"
    messages = kt_warnings(record)
    assert len(messages) == 2
    assert f"m={M} in {sources.table_url(served.url, GPU)}" in messages[0]
    assert "missing parameters" in messages[0] and "GRID_MULT=0" in messages[1]
    runtime.reset()  # next process, the service failing: the cached copy, checked alike
    served.mode = "500"
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert resolution("rmsnorm_fwd", M, N).source == "default"
    cached = [m for m in kt_warnings(record) if "passing over" in m]
    assert len(cached) == 2 and "missing parameters" in cached[0] and "GRID_MULT=0" in cached[1]
    cache_file = str(sources.cache_paths(sources.table_url(served.url, GPU), GPU).table)
    assert all(cache_file in m for m in cached)


def test_a_key_untuned_here_runs_another_gpus_entry(monkeypatch, shipped_dir):
    """Another GPU's shipped table has the key, this GPU's has a nearer shape only: the other
    GPU's entry runs (`transfer`), and its output is right; KERNELTUNE_TRANSFER=0 keeps to
    this GPU's own tables."""
    e = entry("rmsnorm_fwd", N, M)
    write_shipped(shipped_dir, table(e, device=OTHER_GPU))
    write_shipped(shipped_dir, table(entry("rmsnorm_fwd", N, 4 * M, skip=1)))
    r = resolution("rmsnorm_fwd", M, N)
    assert (r.match, r.transfer_from, r.entry.config) == ("transfer", OTHER_GPU, e.config)
    assert f"{OTHER_GPU}'s table" in str(r)
    check_outputs_correct()
    monkeypatch.setenv(transfer.ENV_TRANSFER, "0")
    runtime.reset()
    r = resolution("rmsnorm_fwd", M, N)
    assert (r.match, r.transfer_from, r.entry.m) == ("nearest", None, 4 * M)


def test_the_interpreter_borrows_from_no_gpu(monkeypatch, shipped_dir):
    """Under the interpreter the runtime's device is no GPU: its timings are its own, and no
    GPU's table stands in for a missing one."""
    monkeypatch.setattr(env, "device_name", lambda index=None: INTERPRETER_DEVICE)
    write_shipped(shipped_dir, table(entry("rmsnorm_fwd", N, M), device=OTHER_GPU))
    runtime.reset()
    assert resolution("rmsnorm_fwd", M, N).match == "default"


def test_an_unreadable_table_of_another_gpu_costs_one_warning(shipped_dir):
    (shipped_dir / "broken.json").write_text("{not a table")
    write_shipped(shipped_dir, table(entry("rmsnorm_fwd", N, M), device=OTHER_GPU))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        r = resolution("rmsnorm_fwd", M, N)
        resolution("rmsnorm_fwd", 2 * M, N)
    assert (r.match, r.transfer_from) == ("transfer", OTHER_GPU)  # the readable one still lends
    assert [w for w in kt_warnings(record) if "broken.json" in w] == kt_warnings(record)
    assert len(kt_warnings(record)) == 1


def test_other_gpus_tables_are_read_only_for_a_key_that_may_borrow(shipped_dir):
    """A key this GPU has at its shape never reads another GPU's table (the unreadable one
    stays unread: no warning); the first key that may borrow reads them."""
    (shipped_dir / "broken.json").write_text("{not a table")
    write_shipped(shipped_dir, table(entry("rmsnorm_fwd", N, M)))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert resolution("rmsnorm_fwd", M, N).match == "exact"
        assert kt_warnings(record) == []
        assert resolution("rmsnorm_fwd", M, 2 * N).match != "exact"
        assert len(kt_warnings(record)) == 1 and "broken.json" in kt_warnings(record)[0]
