"""Claims on tuning keys, so that many workers on many hosts tune each key once.

A claim is a row (key, owner, heartbeat) in `kerneltune_tuner_claims`, next to the results and
Optuna's tables. Taking one is a single conditional statement, race-free on PostgreSQL (a row
lock, with the condition re-checked on the newest row version) and on SQLite (one writer at a
time):

    INSERT ... ON CONFLICT DO NOTHING                      -- first claim of a key
    UPDATE ... SET owner = me WHERE key = k AND (owner = me OR heartbeat < now - ttl)

The owner refreshes its heartbeat while it works; a claim whose owner died (no heartbeat for
`ttl` seconds) is taken over by the next worker that asks. Heartbeats are wall-clock seconds of
the owners' hosts, so `ttl` must exceed their clock skew. An owner is named
"host:pid:nonce/lane", so a claim left by a dead process on this same host is taken over at once
(a restarted job resumes without waiting out the ttl).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
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


def process_owner() -> str:
    """A name for this process's claims: "host:pid:nonce" (lanes append "/lane")."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def owner_died_here(owner: str) -> bool:
    """Whether `owner` is a process of this host that no longer runs."""
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    return False


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


def take_over(engine: Engine, key: str, owner: str, previous: str) -> bool:
    """Take `key` from `previous` (a dead owner); False if anyone else changed it meanwhile."""
    with engine.begin() as conn:
        return conn.execute(
            update(claims).where(claims.c.key == key, claims.c.owner == previous)
            .values(owner=owner, heartbeat=time.time(), claimed_at=time.time())
        ).rowcount == 1


def claim(engine: Engine, key: str, owner: str, *, ttl_s: float) -> bool:
    """`try_claim`, also taking over at once a claim whose owner died on this host."""
    if try_claim(engine, key, owner, ttl_s=ttl_s):
        return True
    previous = holder(engine, key)
    return (previous is not None and owner_died_here(previous)
            and take_over(engine, key, owner, previous))


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
