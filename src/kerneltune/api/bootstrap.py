"""Getting a store ready to serve: migrated, and loaded with the tables shipped in the package."""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import Engine, select

from kerneltune.kernels import current_entries
from kerneltune.storage import (
    Result,
    default_database_url,
    import_table,
    make_engine,
    migrate,
    normalize_url,
    run_transaction,
    session_factory,
)
from kerneltune.table import Table, TableError, load, shipped_tables_dir

log = logging.getLogger(__name__)


def shipped_tables(directory: Path | None = None) -> list[Table]:
    """The package's tables (one JSON per GPU model); an unreadable one is logged and skipped."""
    tables = []
    for path in sorted((directory or shipped_tables_dir()).glob("*.json")):
        try:
            tables.append(load(path))
        except (OSError, TableError) as e:
            log.error("skipping shipped table %s: %s", path, e)
    return tables


def is_empty(engine: Engine) -> bool:
    with session_factory(engine)() as session:
        return session.execute(select(Result.id).limit(1)).first() is None


def prepare_database(
    url: str | None = None, *, load_shipped: bool | None = None, tables_dir: Path | None = None
) -> int:
    """Migrate the store at `url` (default: `default_database_url()`), then import the shipped
    tables into it when `load_shipped` is true, or, when it is None, when the store is the
    default one or holds no result yet. Importing again changes nothing (the faster result is
    kept), so this runs at every start. Returns how many entries the import stored."""
    url = url or default_database_url()
    engine = make_engine(url)
    try:
        migrate(engine)
        if load_shipped is None:
            is_default = normalize_url(url) == normalize_url(default_database_url())
            load_shipped = is_default or is_empty(engine)
        if not load_shipped:
            return 0
        stored = 0
        sessions = session_factory(engine)
        for table in shipped_tables(tables_dir):
            # Only the running code's entries: a stale one is never served, so a row of it
            # would only stand where this store has none. Workers starting together import
            # the same rows: a transaction aborted by the conflict runs again.
            current = current_entries(table)
            stored += run_transaction(sessions, lambda s, t=current: import_table(s, t))
        log.info("shipped tables: %d entries stored", stored)
        return stored
    finally:
        engine.dispose()
