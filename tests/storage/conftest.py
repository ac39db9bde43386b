"""Fixtures for the store's tests: a migrated engine on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, orm

from kerneltune.storage import make_engine, migrate, session_factory
from kerneltune.table import Entry, Env

GPU = "NVIDIA H100 80GB HBM3"


def make_entry(
    us: float = 10.0,
    *,
    kernel: str = "rmsnorm_fwd",
    dtype: str = "bfloat16",
    n: int = 4096,
    m: int = 64,
    kernel_hash: str = "hash-a",
    block: int = 1024,
    **fields,
) -> Entry:
    """An entry with plausible numbers; `block` tells configs apart."""
    values = {
        "config": {"BLOCK_N": block, "num_warps": 4, "ROWS": 1},
        "gbps": 1000.0 / us if us else 0.0,
        "default_us": 12.5,
        "trials": 20,
        "frac_copy": 0.5,
        "default_config": {"BLOCK_N": 4096, "num_warps": 8, "ROWS": 1},
        "env": Env(triton="3.6.0", torch="2.11.0+cu130", cuda="13.0", driver="580.1"),
        **fields,
    }
    return Entry(kernel=kernel, dtype=dtype, n=n, m=m, us=us, kernel_hash=kernel_hash, **values)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request) -> str:
    """The URL of an empty store, once on SQLite and once on PostgreSQL."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


@pytest.fixture
def engine(store_url) -> Iterator[Engine]:
    engine = make_engine(store_url)
    migrate(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def Session(engine) -> orm.sessionmaker[orm.Session]:
    return session_factory(engine)
