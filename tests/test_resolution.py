"""The resolution rule (`kerneltune.resolution.resolve`) on random tables: its invariants, and
the service's answer equal to the runtime's for the same entries.

Tables mix entries whose configs are valid or not for the shape asked about, shapes at equal
distances, the other 16-bit dtype, other kernels and stale kernel hashes. The kernels are the
registry's own (their spaces and constraints are plain Python); nothing is launched.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.runtime_table import runtime_on_table

from kerneltune import env, runtime
from kerneltune.api import answers
from kerneltune.api.app import create_app
from kerneltune.api.settings import Settings
from kerneltune.kernels import REGISTRY, KernelSpec
from kerneltune.resolution import (
    Resolution,
    Source,
    entry_refusal,
    rank_transfers,
    refused_entries,
    resolve,
    usable_config,
)
from kerneltune.runtime import transfer
from kerneltune.storage import make_engine, migrate, session_factory, upsert_device, upsert_result
from kerneltune.table import Config, Entry, Table, dumps, m_bucket, with_same_width

GPU = "NVIDIA Resolution Test GPU"
STALE = "0" * 16
KERNELS = sorted(REGISTRY)
DTYPES = ("float32", "float16", "bfloat16")
#: Tuned shapes: powers of two (so that, e.g., 1024 and 4096 are equally near 2048) and others.
TUNED_N = (64, 96, 128, 256, 512, 1024, 2048, 3072, 4096, 8192)
TUNED_M = (1, 4, 16, 64, 256, 1024)
ASKED_N = (*TUNED_N, 48, 1536, 5000, 16384)
ASKED_M = (1, 3, 16, 17, 64, 100, 1024, 5000)
HASHES = {name: spec.kernel_hash for name, spec in REGISTRY.items()}


def config_pool(spec: KernelSpec) -> list[Config]:
    """Table configs (JSON) a table may hold: the defaults of many shapes, each parameter of
    some of them set to every value of its space (valid for some shapes only), loops over short
    chunks (valid for every longer row), and configs the kernel cannot read: parameters
    missing, unknown or of the wrong type."""
    base = spec.default(spec.problem(64, 1024)).to_json()
    loop = spec.default(spec.problem(64, 32768)).to_json()
    pool: list[Config] = [{**loop, "BLOCK_N": block, "ROWS": 1, "num_warps": warps}
                          for block in (512, 1024, 2048) for warps in (1, 2, 4)]
    for n, m, dtype in itertools.product(TUNED_N, (1, 64, 4096), ("float32", "bfloat16")):
        problem = spec.problem(m, n, dtype)
        default = spec.default(problem).to_json()
        pool.append(default)
        if m == 64 and n in (128, 1024, 8192):
            pool += [{**default, name: value} for name, values in spec.space(problem).items()
                     for value in values if value != default[name]]
    pool += [{"BLOCK_N": 128}, {**base, "NOT_A_PARAMETER": 1}, {**base, "BLOCK_N": "wide"},
             {**base, "num_warps": 4.0}, {**base, "SINGLE": 1}]
    unique = {tuple(sorted(c.items())): c for c in pool}
    return list(unique.values())


def broad(spec: KernelSpec, pool: list[Config]) -> list[Config]:
    """The configs of `pool` that run at least half the tuned Ns (loops over short chunks, for
    one): equally near shapes then compete."""
    def runs(config: Config, n: int) -> bool:
        return usable_config(spec, spec.problem(64, n, "bfloat16"), config) is not None
    return [c for c in pool if 2 * sum(runs(c, n) for n in TUNED_N) >= len(TUNED_N)]


POOLS = {name: config_pool(spec) for name, spec in REGISTRY.items()}
BROAD = {name: broad(spec, POOLS[name]) for name, spec in REGISTRY.items()}


@st.composite
def entries(draw: st.DrawFn, kernel: str) -> Entry:
    """An entry, mostly of `kernel`, one in four stale; its config the default of its own
    shape, one that runs many shapes, or any of the pool's."""
    name = draw(st.sampled_from((kernel, kernel, kernel, draw(st.sampled_from(KERNELS)))))
    spec = REGISTRY[name]
    dtype, n, m = (draw(st.sampled_from(choices)) for choices in (DTYPES, TUNED_N, TUNED_M))
    config = draw(st.one_of(st.just(spec.default(spec.problem(m, n, dtype)).to_json()),
                            st.sampled_from(BROAD[name]), st.sampled_from(POOLS[name])))
    return Entry(
        kernel=name, dtype=dtype, n=n, m=m, config=config,
        us=draw(st.integers(1, 1000)) / 10, gbps=100.0, default_us=120.0, trials=5,
        kernel_hash=draw(st.sampled_from((HASHES[name],) * 3 + (STALE,))),
    )


def tables_of(kernel: str, max_tables: int) -> st.SearchStrategy[list[list[Entry]]]:
    """Tables (lists of entries with unique keys, as the table format and the store hold)."""
    table = st.lists(entries(kernel), max_size=12, unique_by=lambda e: e.key)
    return st.lists(table, min_size=1, max_size=max_tables)


@st.composite
def queries(draw: st.DrawFn, tables: list[list[Entry]]) -> list[tuple[int, int, str]]:
    """(M, N, dtype) keys to resolve: half at or beside tuned shapes, half anywhere."""
    tuned = [e for t in tables for e in t]
    found = []
    for _ in range(draw(st.integers(1, 6))):
        if tuned and draw(st.booleans()):
            e = draw(st.sampled_from(tuned))
            m = draw(st.sampled_from((e.m, e.m // 2 + 1, 2 * e.m)))
            found.append((m, e.n, draw(st.sampled_from(with_same_width(e.dtype)))))
        else:
            found.append((draw(st.sampled_from(ASKED_M)), draw(st.sampled_from(ASKED_N)),
                          draw(st.sampled_from(DTYPES))))
    return found


@st.composite
def cases(draw: st.DrawFn, max_tables: int
          ) -> tuple[KernelSpec, list[list[Entry]], list[tuple[int, int, str]]]:
    kernel = draw(st.sampled_from(KERNELS))
    tables = draw(tables_of(kernel, max_tables))
    return REGISTRY[kernel], tables, draw(queries(tables))


def labelled(tables: Sequence[Sequence[Entry]]) -> list[Source]:
    """Tables as the resolution takes them, the first a `Table`, the others plain lists."""
    return [Source(f"t{i}", f"origin-{i}", Table(GPU, entries=list(t)) if i == 0 else list(t))
            for i, t in enumerate(tables)]


def rank(e: Entry, table: int, n: int, bucket: int, dtype: str) -> tuple[Any, ...]:
    """Where `e` stands in the rule's order for the key (lower first), as the docstring of
    `resolve` states it: the step, the table, then the distance of the shapes."""
    same_shape = (e.n, e.m) == (n, bucket)
    step = (0 if same_shape else 2) + (e.dtype != dtype)
    ratio_n, ratio_m = Fraction(max(e.n, n), min(e.n, n)), Fraction(max(e.m, bucket),
                                                                     min(e.m, bucket))
    return (step, table) if step < 2 else (step, table, ratio_n, ratio_m, -e.m, -e.n)


# ------------------------------------------------------------------------------ the rule


@settings(max_examples=300, deadline=None)
@given(cases(max_tables=3))
def test_resolution_invariants(case) -> None:
    spec, tables, keys = case
    running = HASHES[spec.name]
    for m, n, dtype in keys:
        r = resolve(spec, m, n, dtype, kernel_hash=running, tables=labelled(tables))
        bucket = m_bucket(m)
        problem = spec.problem(bucket, n, dtype)
        assert (r.kernel, r.n, r.dtype, r.m_bucket) == (spec.name, n, dtype, bucket)
        usable = [(rank(e, i, n, bucket, dtype), i, e) for i, t in enumerate(tables) for e in t
                  if e.kernel == spec.name and e.kernel_hash == running
                  and e.dtype in with_same_width(dtype)
                  and usable_config(spec, problem, e.config) is not None]
        # The entries met before the answer that cannot run even at their own key are listed,
        # each once, in the order met; those merely tuned for another shape are not.
        answer_rank = min((u[0] for u in usable), default=None)
        met = sorted(((rank(e, i, n, bucket, dtype), i, e) for i, t in enumerate(tables)
                      for e in t if e.kernel == spec.name and e.kernel_hash == running
                      and e.dtype in with_same_width(dtype)), key=lambda u: u[0])
        broken = [e for key, _, e in met if (answer_rank is None or key < answer_rank)
                  and entry_refusal(spec, e) is not None]
        assert [p.entry for p in r.passed_over] == broken
        for p in r.passed_over:
            assert (p.source, p.reason) == (f"t{first_table(tables, p.entry)}",
                                            entry_refusal(spec, p.entry))
        if not usable:
            # The default only when nothing current and valid is tuned in the same width.
            assert (r.match, r.source, r.origin, r.entry) == ("default", "default", None, None)
            assert r.config == spec.default(problem)
            continue
        _, first, best = min(usable, key=lambda u: u[0])
        # The first entry in the rule's order wins: an exact one from the first table that
        # has it, else the nearest.
        assert r.entry is best
        assert (r.source, r.origin) == (f"t{first}", f"origin-{first}")
        exact = best.dtype == dtype and (best.n, best.m) == (n, bucket)
        assert r.match == ("exact" if exact else "nearest")
        # Never stale; always one the kernel may run here.
        assert r.entry.kernel_hash == running
        assert r.config == spec.parse(problem, r.entry.config)
        assert spec.rejects(problem, r.config) is None


def first_table(tables: list[list[Entry]], e: Entry) -> int:
    return next(i for i, t in enumerate(tables) if any(x is e for x in t))


def entry_of(n: int, m: int, dtype: str = "bfloat16", config: Config | None = None,
             kernel_hash: str | None = None, kernel: str = "rmsnorm_fwd") -> Entry:
    spec = REGISTRY[kernel]
    return Entry(kernel, dtype, n, m, config or spec.default(spec.problem(m, n, dtype)).to_json(),
                 us=1.0, gbps=1.0, default_us=1.0, trials=1,
                 kernel_hash=spec.kernel_hash if kernel_hash is None else kernel_hash)


def resolved(entries: Sequence[Entry] | Sequence[Sequence[Entry]], m: int, n: int,
             dtype: str = "bfloat16") -> Resolution:
    spec = REGISTRY["rmsnorm_fwd"]
    tables = entries if entries and not isinstance(entries[0], Entry) else [entries]
    return resolve(spec, m, n, dtype, kernel_hash=spec.kernel_hash,
                   tables=labelled(tables))  # type: ignore[arg-type]


def loop_config() -> Config:
    """A forward config that loops over chunks of 512: it runs every N above 512."""
    spec = REGISTRY["rmsnorm_fwd"]
    config = {**spec.default(spec.problem(64, 1024)).to_json(), "BLOCK_N": 512, "SINGLE": False,
              "ROWS": 1, "num_warps": 2, "num_stages": 1}
    assert all(usable_config(spec, spec.problem(64, n), config) for n in (1024, 2048, 4096))
    return config


def test_an_invalid_nearest_entry_gives_way_to_the_next_in_the_same_dtype() -> None:
    """A whole-row block tuned for N = 2048 cannot run N = 4096: the next nearest bf16 shape
    comes before the fp16 entry at the nearest shape of all."""
    near = entry_of(2048, 64)
    further = entry_of(8192, 64, config=loop_config())
    twin = entry_of(2048, 64, "float16", config=loop_config())
    assert (resolved([near, twin, further], 64, 4096).entry) == further
    assert (resolved([near, twin], 64, 4096).entry) == twin
    assert resolved([near], 64, 4096).match == "default"


def test_equal_distances_go_to_the_larger_m_then_the_larger_n() -> None:
    around = [entry_of(n, m, config=loop_config()) for n in (1024, 4096) for m in (16, 256)]
    r = resolved(around, 64, 2048)
    assert (r.match, r.entry.n, r.entry.m) == ("nearest", 4096, 256)
    assert resolved(around[:3], 64, 2048).entry.m == 256  # 1024 x 256 before 4096 x 16
    assert resolved(around[::-1], 64, 2048).entry == r.entry  # whatever the table's order


def test_tables_in_their_order_at_each_step() -> None:
    exact_second = entry_of(1024, 64)
    twin_first = entry_of(1024, 64, "float16")
    near_first = entry_of(1024, 128)
    r = resolved([[twin_first, near_first], [exact_second]], 64, 1024)
    assert (r.match, r.source, r.entry) == ("exact", "t1", exact_second)
    r = resolved([[near_first], [twin_first]], 64, 1024)
    assert (r.match, r.source, r.entry) == ("nearest", "t1", twin_first)
    r = resolved([[near_first], [entry_of(1024, 256)]], 64, 1024)
    assert (r.source, r.entry) == ("t0", near_first)  # the first table's nearest, not the nearest


def test_stale_and_unreadable_entries_are_never_used() -> None:
    stale = entry_of(1024, 64, kernel_hash=STALE)
    assert resolved([stale], 64, 1024).match == "default"
    config = dict(stale.config)
    for unreadable in ({**config, "NOT_A_PARAMETER": 1}, {**config, "BLOCK_N": "wide"},
                       {**config, "num_warps": 4.0}, {"num_warps": 2}):
        assert resolved([entry_of(1024, 64, config=unreadable)], 64, 1024).match == "default"
    # An entry stored before a parameter was added ran with its default value.
    del config["LATE_RELEASE"]
    older = entry_of(1024, 64, config=config)
    r = resolved([stale, older], 64, 1024)
    assert (r.match, r.entry, r.config.LATE_RELEASE) == ("exact", older, False)


def test_broken_entries_met_are_listed_those_for_other_shapes_are_not() -> None:
    """An entry whose config cannot run at its own key is passed over and listed, once, with
    its table and why; one that runs its own key but not the one asked about is passed over
    silently (a nearest shape, not a fault); entries after the answer are not met at all."""
    spec = REGISTRY["rmsnorm_fwd"]
    broken = entry_of(1024, 64, config={**entry_of(1024, 64).config, "ROWS": -1})
    other_shape = entry_of(2048, 64)  # a whole-row block of 2048: not for rows of 1024
    answer = entry_of(1024, 256, config=loop_config())
    later = entry_of(1024, 4096, config={"BLOCK_N": 1024})
    r = resolved([[broken, other_shape], [answer, later]], 64, 1024)
    assert (r.match, r.entry) == ("nearest", answer)
    (passed,) = r.passed_over
    assert (passed.entry, passed.source, passed.origin) == (broken, "t0", "origin-0")
    assert passed.reason == entry_refusal(spec, broken) and "ROWS=-1" in passed.reason
    assert "rmsnorm_fwd bfloat16 n=1024 m=64 in origin-0" in str(passed)
    # Met at the exact step and again among the nearest: still listed once.
    r = resolved([broken, other_shape], 64, 1024)
    assert r.match == "default" and [p.entry for p in r.passed_over] == [broken]
    # Listing them does not change what a resolution is equal to.
    assert resolved([broken, answer], 64, 1024) == resolved([answer], 64, 1024)


def test_refused_entries_name_each_index_and_why() -> None:
    """What `import`, `merge` and the service refuse: an unknown kernel, a config its kernel
    refuses at the entry's own key; not an entry of other kernel code whose config is valid."""
    good = entry_of(1024, 64)
    stale = entry_of(1024, 128, kernel_hash=STALE)
    bad = entry_of(2048, 64, config={**good.config, "num_warps": 3})
    unknown = replace(good, kernel="no_such_kernel")
    found = refused_entries([good, stale, bad, unknown], REGISTRY)
    assert [(i, e) for i, e, _ in found] == [(2, bad), (3, unknown)]
    assert "num_warps=3" in found[0][2] and "unknown kernel 'no_such_kernel'" in found[1][2]


# ------------------------------------------------------------------------------ transfer


def gpu_table(device: str, entries: Sequence[Entry], capability: str | None = "9.0",
              copy_gbps: float | None = 4000.0, source: str = "shipped") -> Source:
    return Source(source, f"{device}.json", Table(device, copy_gbps=copy_gbps, entries=list(
        entries), compute_capability=capability))


def transferred(own: Sequence[Entry], others: Sequence[Source], m: int, n: int,
                dtype: str = "bfloat16") -> Resolution:
    spec = REGISTRY["rmsnorm_fwd"]
    return resolve(spec, m, n, dtype, kernel_hash=spec.kernel_hash,
                   tables=[gpu_table(GPU, own, source="table")], transfers=others)


def test_a_key_untuned_here_borrows_another_gpus_entry_before_a_nearer_shape() -> None:
    tuned_there = entry_of(1024, 64, config=loop_config())
    other = gpu_table("NVIDIA Other GPU", [tuned_there])
    r = transferred([entry_of(1024, 128)], [other], 50, 1024)
    assert (r.match, r.transfer_from, r.entry, r.source) == (
        "transfer", "NVIDIA Other GPU", tuned_there, "shipped")
    assert "NVIDIA Other GPU's table" in str(r)
    # This GPU's own same shape in the other 16-bit dtype comes first.
    twin = entry_of(1024, 64, "float16")
    assert transferred([twin], [other], 64, 1024).entry is twin
    # Another GPU's same shape in the other dtype is still a transfer.
    r = transferred([], [gpu_table("NVIDIA Other GPU", [twin])], 64, 1024)
    assert (r.match, r.entry) == ("transfer", twin)


def test_transfer_passes_over_stale_and_refused_entries_gpu_by_gpu() -> None:
    stale = gpu_table("NVIDIA A", [entry_of(4096, 64, kernel_hash=STALE)])
    refused = gpu_table("NVIDIA B", [entry_of(4096, 64, config={**loop_config(), "ROWS": -1})])
    good_entry = entry_of(4096, 64, config=loop_config())
    good = gpu_table("NVIDIA C", [good_entry])
    r = transferred([], [stale, refused, good], 64, 4096)
    assert (r.match, r.transfer_from, r.entry) == ("transfer", "NVIDIA C", good_entry)
    assert [p.origin for p in r.passed_over] == ["NVIDIA B.json"]  # reported, not used
    assert transferred([entry_of(4096, 16)], [stale], 64, 4096).match == "nearest"
    assert transferred([], [], 64, 4096).match == "default"


GPUS = st.builds(
    lambda name, capability, copy: gpu_table(name, [], capability, copy),
    st.sampled_from([f"GPU {c}" for c in "ABCDEFGH"]),
    st.sampled_from([None, "8.0", "9.0", "10.0"]),
    st.sampled_from([None, 2000.0, 3000.0, 4000.0, 4800.0]),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(GPUS, max_size=8, unique_by=lambda s: s.device), st.randoms(),
       st.sampled_from([None, "9.0"]), st.sampled_from([None, 3500.0]))
def test_gpus_rank_by_architecture_then_bandwidth(others, rng, capability, copy) -> None:
    ranked = rank_transfers("GPU A", capability, copy, others)
    shuffled = list(others)
    rng.shuffle(shuffled)
    assert ranked == rank_transfers("GPU A", capability, copy, shuffled)  # order-free
    assert sorted(s.device for s in ranked) == sorted(
        s.device for s in others if s.device != "GPU A")  # every other GPU, this one not

    def key(s: Source) -> tuple[bool, float]:
        t = s.table
        same = capability is not None and t.compute_capability == capability
        far = abs(math.log(t.copy_gbps / copy)) if t.copy_gbps and copy else math.inf
        return (not same, far)

    assert [key(s) for s in ranked] == sorted(key(s) for s in ranked)


# ------------------------------------------------------------------- service and runtime


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Iterator[tuple[Any, TestClient]]:
    """A migrated SQLite store and the service over it (the app, in process)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('store') / 'kerneltune.db'}"
    engine = make_engine(url)
    migrate(engine)
    # Transfers off: each example's GPU stands alone (`test_transfers_...` covers them).
    settings = Settings(database_url=url, write_token=None, transfer=False)
    with TestClient(create_app(settings)) as client:
        yield session_factory(engine), client
    engine.dispose()


@pytest.fixture(scope="module")
def table_file(tmp_path_factory) -> Iterator[Path]:
    """The runtime on this GPU with the table written to the returned path as its only source
    (KERNELTUNE_TABLE; no service, no shipped table)."""
    with runtime_on_table(tmp_path_factory.mktemp("runtime"), GPU) as path:
        yield path


_devices = itertools.count()


def summary(r: Resolution) -> tuple[str, Config, dict[str, Any] | None]:
    key = None if r.entry is None else {"n": r.entry.n, "m": r.entry.m, "dtype": r.entry.dtype}
    return r.match, r.config.to_json(), key


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(max_tables=1))
def test_the_service_answers_as_the_runtime(store, table_file, case) -> None:
    """One table, stored through the storage layer and given to the runtime as its table
    file: the service's lookup and its HTTP route answer every key with the runtime's config,
    match and tuned key."""
    spec, (table,), keys = case
    Session, client = store
    device = f"Store GPU {next(_devices)}"  # a GPU of its own per example: a fresh table
    with Session.begin() as session:
        upsert_device(session, device)
        for e in table:
            assert upsert_result(session, device, e)
    table_file.write_text(dumps(Table(GPU, entries=table)))
    runtime.reset()
    for m, n, dtype in keys:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", runtime.KerneltuneWarning)  # stale entries
            r = runtime.explain(spec.name, (m, n, dtype))
        assert r.source in ("table", "default")
        expected = summary(r)
        with Session() as session:
            answer = answers.config_answer(session, spec, device, dtype, n, m).model_dump()
        got = client.get(f"/api/v1/configs/{spec.name}",
                         params={"gpu": device, "n": n, "m": m, "dtype": dtype})
        assert got.status_code == 200, got.text
        for a in (answer, got.json()):
            assert (a["match"], a["config"], a["key"]) == expected, (m, n, dtype)
            assert (a["m"], a["m_bucket"]) == (m, m_bucket(m))
            measured = a["measurement"]
            assert (None if measured is None else (measured["us"], measured["stale"])) == (
                None if r.entry is None else (r.entry.us, False))


def other_config(spec: KernelSpec, m: int, n: int, skip: int) -> Config:
    """A valid config of the problem other than its default (the `skip`-th), so its GPU shows."""
    problem = spec.problem(m, n, "bfloat16")
    found = [c for c in spec.configs(problem) if c != spec.default(problem)]
    return found[skip % len(found)].to_json()


def test_transfers_the_service_answers_as_the_runtime(tmp_path) -> None:
    """This GPU (9.0, 4000 GB/s) tuned at a few keys, two GPUs of its architecture and one of
    another tuned at others: the service over their stored results and the runtime over its
    table file and the other GPUs' tables answer every key alike, transfers included."""
    url = f"sqlite:///{tmp_path / 'kerneltune.db'}"
    engine = make_engine(url)
    migrate(engine)
    Session = session_factory(engine)
    spec = REGISTRY["rmsnorm_fwd"]
    here, keys = "Transfer Test GPU", [(n, m) for n in (1024, 2048, 4096) for m in (1, 64, 4096)]
    gpus = {  # name: (capability, copy GB/s, tuned keys)
        here: ("9.0", 4000.0, keys[:2]),
        "Transfer Peer Far": ("9.0", 2000.0, keys[:7]),
        "Transfer Peer Near": ("9.0", 4400.0, keys[3:5]),
        "Transfer Other Arch": ("8.0", 4000.0, keys),
    }
    tables = {}
    for device, (capability, copy, tuned) in gpus.items():
        entries = [replace(entry_of(n, m, config=other_config(spec, m, n, skip=len(device))),
                           us=float(len(device))) for n, m in tuned]
        tables[device] = Table(device, copy_gbps=copy, compute_capability=capability,
                               entries=entries)
        with Session.begin() as session:
            upsert_device(session, device, compute_capability=capability, copy_gbps=copy)
            for e in entries:
                assert upsert_result(session, device, e)
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    for device, table in tables.items():
        if device != here:
            (shipped / f"{device}.json").write_text(dumps(table))
    app = create_app(Settings(database_url=url, write_token=None))
    with runtime_on_table(tmp_path, here) as path, pytest.MonkeyPatch.context() as mp, \
            TestClient(app) as transferring:
        path.write_text(dumps(tables[here]))
        mp.setattr(transfer, "shipped_tables_dir", lambda: shipped)
        mp.setattr(env, "compute_capability", lambda index=None: "9.0")
        runtime.reset()
        matches = set()
        for n in (1024, 2048, 4096, 8192):
            for m in (1, 64, 100, 4096):
                r = runtime.explain(spec.name, (m, n, "bfloat16"))
                got = transferring.get(f"/api/v1/configs/{spec.name}",
                                       params={"gpu": here, "n": n, "m": m}).json()
                assert (got["match"], got["config"], got["key"], got["transfer_from"]) == (
                    *summary(r), r.transfer_from), (n, m)
                matches.add((r.match, r.transfer_from))
    engine.dispose()
    assert matches == {("exact", None), ("transfer", "Transfer Peer Near"),
                       ("transfer", "Transfer Peer Far"), ("transfer", "Transfer Other Arch"),
                       ("nearest", None)}


def test_a_cached_answer_follows_another_gpus_new_entry_at_its_key(tmp_path) -> None:
    """The service keeps answers per version of the GPU's own results; one that borrowed, or
    found nothing to borrow, is dropped when another GPU's entry at its shape appears or
    changes, and one from the GPU's own entry is not."""
    url = f"sqlite:///{tmp_path / 'kerneltune.db'}"
    engine = make_engine(url)
    migrate(engine)
    Session = session_factory(engine)
    spec = REGISTRY["rmsnorm_fwd"]
    with Session.begin() as session:
        upsert_device(session, "Asking GPU", compute_capability="9.0", copy_gbps=4000.0)
        upsert_result(session, "Asking GPU", entry_of(1024, 64))
        upsert_device(session, "Lending GPU", compute_capability="9.0", copy_gbps=3000.0)
    with TestClient(create_app(Settings(database_url=url, write_token=None))) as client:
        def ask(n: int) -> dict[str, Any]:
            return client.get(f"/api/v1/configs/{spec.name}",
                              params={"gpu": "Asking GPU", "n": n, "m": 64}).json()

        assert (ask(2048)["match"], ask(1024)["match"]) == ("default", "exact")  # none to lend
        for us in (5.0, 4.0):  # a new entry, then a faster one at the same key
            lent = replace(entry_of(2048, 64, config=other_config(spec, 64, 2048, int(us))),
                           us=us)
            with Session.begin() as session:
                assert upsert_result(session, "Lending GPU", lent)
            got = ask(2048)
            assert (got["match"], got["transfer_from"], got["config"]) == (
                "transfer", "Lending GPU", lent.config)
            assert ask(1024)["match"] == "exact"
    engine.dispose()
