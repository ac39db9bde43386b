"""Claims on tuning keys, so that many workers on many hosts tune each key once.

A claim is a row (key, owner, heartbeat) in `kerneltune_tuner_claims`, next to the results and
Optuna's tables. Taking one is a single conditional statement, race-free on PostgreSQL (a row
lock, with the condition re-checked on the newest row version) and on SQLite (one writer at a
time):

    INSERT ... ON CONFLICT DO NOTHING                      -- first claim of a key
    UPDATE ... SET owner = me WHERE key = k AND (owner = me OR heartbeat < now - ttl)

The owner refreshes its heartbeat while it works; a claim whose owner died (no heartbeat for
`ttl` seconds) is taken over by the next worker that asks. Heartbeats are wall-clock seconds of
the owners' hosts, so `ttl` must exceed their clock skew.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from sqlalchemy import Column, Engine, Float, MetaData, String, Table, delete, or_, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

metadata = MetaData()
claims = Table(
    "kerneltune_tuner_claims",
    metadata,
    Column("key", String(512), primary_key=True),
    Column("owner", String(200), nullable=False),
    Column("heartbeat", Float, nullable=False),
    Column("claimed_at", Float, nullable=False),
)


def create_claims_table(engine: Engine) -> None:
    metadata.create_all(engine, checkfirst=True)


def _insert(engine: Engine):  # type: ignore[no-untyped-def]
    return (pg_insert if engine.dialect.name == "postgresql" else sqlite_insert)(claims)


def try_claim(engine: Engine, key: str, owner: str, *, ttl_s: float) -> bool:
    """Claim `key` for `owner` unless a live owner holds it; True when `owner` holds it now."""
    now = time.time()
    with engine.begin() as conn:
        conn.execute(
            _insert(engine)
            .values(key=key, owner=owner, heartbeat=now, claimed_at=now)
            .on_conflict_do_nothing(index_elements=["key"])
        )
        taken = conn.execute(
            update(claims)
            .where(claims.c.key == key,
                   or_(claims.c.owner == owner, claims.c.heartbeat < now - ttl_s))
            .values(owner=owner, heartbeat=now)
        )
        return taken.rowcount == 1


def heartbeat(engine: Engine, owners: Iterable[str]) -> int:
    """Refresh every claim of `owners`; returns how many claims are held."""
    owners = list(owners)
    if not owners:
        return 0
    with engine.begin() as conn:
        return conn.execute(
            update(claims).where(claims.c.owner.in_(owners)).values(heartbeat=time.time())
        ).rowcount


def release(engine: Engine, key: str, owner: str) -> None:
    with engine.begin() as conn:
        conn.execute(delete(claims).where(claims.c.key == key, claims.c.owner == owner))


def holder(engine: Engine, key: str) -> str | None:
    with engine.connect() as conn:
        row = conn.execute(claims.select().where(claims.c.key == key)).one_or_none()
    return None if row is None else row.owner
