"""Alembic environment for kerneltune's store.

`kerneltune.storage.migrate()` passes an open connection in `config.attributes["connection"]`.
Run from the command line (`alembic -c src/kerneltune/storage/migrations/alembic.ini ...`), it
connects to `sqlalchemy.url` from the ini file if set, else to `KERNELTUNE_DATABASE_URL` or the
default store.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from kerneltune.storage._engine import default_database_url, make_engine
from kerneltune.storage._migrate import VERSION_TABLE
from kerneltune.storage._models import Base

config = context.config
target_metadata = Base.metadata


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        # SQLite cannot ALTER most things in place; batch mode copies the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url") or default_database_url(),
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        return
    engine = make_engine(config.get_main_option("sqlalchemy.url") or None)
    try:
        with engine.connect() as connection:
            _configure(connection)
            connection.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
