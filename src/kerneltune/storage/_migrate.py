"""Alembic migrations run from code: `migrate()` brings a database to the newest schema.

Optuna keeps its own `alembic_version` table in the same database, so ours is
`kerneltune_alembic_version`. Several workers may start at once against one store: on PostgreSQL
a transaction-scoped advisory lock serialises them (DDL is transactional there, so a waiter
sees the finished schema), on SQLite `BEGIN IMMEDIATE` takes the single writer lock for the
whole upgrade.
"""

from __future__ import annotations

import functools
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import URL

from kerneltune.storage._engine import make_engine

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
VERSION_TABLE = "kerneltune_alembic_version"
# Any fixed 64-bit key that no other application on the server uses: ASCII "ktmigrat".
_PG_ADVISORY_LOCK_KEY = int.from_bytes(b"ktmigrat", "big") & 0x7FFF_FFFF_FFFF_FFFF


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config pointing at the migrations shipped in this package."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


@functools.cache
def head_revisions() -> frozenset[str]:
    return frozenset(ScriptDirectory.from_config(alembic_config()).get_heads())


def current_revisions(connection: Connection) -> frozenset[str]:
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return frozenset(context.get_current_heads())


def is_migrated(engine: Engine) -> bool:
    """Whether the database is at the newest schema. Raises if the database cannot be reached."""
    with engine.connect() as connection:
        return current_revisions(connection) == head_revisions()


def migrate(url_or_engine: str | URL | Engine | None = None) -> None:
    """Upgrade the database to the newest schema (`alembic upgrade head`); idempotent, and safe
    when several processes call it at once. A URL (or None: the default store) gets an engine of
    its own, disposed of afterwards."""
    if isinstance(url_or_engine, Engine):
        _migrate(url_or_engine)
        return
    engine = make_engine(url_or_engine)
    try:
        _migrate(engine)
    finally:
        engine.dispose()


def _migrate(engine: Engine) -> None:
    if is_migrated(engine):  # the common case: no lock taken
        return
    with engine.connect() as connection:
        backend = engine.dialect.name
        if backend == "postgresql":
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_ADVISORY_LOCK_KEY}
            )
        elif backend == "sqlite":
            # pysqlite runs DDL outside transactions unless one is opened explicitly.
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        # env.py runs inside this transaction; Alembic sees it and leaves committing to us.
        command.upgrade(alembic_config(connection), "head")
        connection.commit()


def rename_kernel_hashes(old_to_new: dict[str, str]) -> None:
    """In a migration: give results and the tuner's Optuna studies (named
    "kerneltune:...:<kernel hash>") measured on device code that a new hash rule still covers
    the new hash, rather than leave them stale."""
    import sqlalchemy as sa
    from alembic import op

    bind = op.get_bind()
    results = sa.table("results", sa.column("kernel_hash", sa.String))
    for old, new in old_to_new.items():
        op.execute(results.update().where(results.c.kernel_hash == old)
                   .values(kernel_hash=new))
    if sa.inspect(bind).has_table("studies"):
        studies = sa.table("studies", sa.column("study_name", sa.String))
        for old, new in old_to_new.items():
            op.execute(studies.update()
                       .where(studies.c.study_name.like(f"kerneltune:%:{old}"))
                       .values(study_name=sa.func.replace(studies.c.study_name, f":{old}",
                                                          f":{new}")))
