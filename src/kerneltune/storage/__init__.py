"""kerneltune's store: tuned results per GPU model, tuning runs, and the table exchange.

SQLAlchemy models with Alembic migrations, on SQLite (the default, a file in the user's data
directory) or PostgreSQL (shared by many tuning workers). Optuna's studies live in the same
database; its bookkeeping and ours do not collide.

    engine = make_engine()              # KERNELTUNE_DATABASE_URL or the default SQLite file
    migrate(engine)                     # idempotent, safe from many processes at once
    Session = session_factory(engine)
    with Session.begin() as session:    # the functions below never commit: the caller does
        upsert_result(session, "NVIDIA H100 80GB HBM3", entry)
    run_transaction(Session, lambda s: upsert_results(s, device, entries))  # retried on conflict

Importing this package imports SQLAlchemy and Alembic; the runtime never does.
"""

from kerneltune.storage._engine import (
    CONFLICT_SQLSTATES,
    ENV_DATABASE_URL,
    TRANSACTION_ATTEMPTS,
    ErrorKind,
    StoreGoneError,
    UnsupportedDatabaseError,
    configure_sqlite,
    data_dir,
    default_database_url,
    error_kind,
    make_engine,
    normalize_url,
    retry_delay_s,
    run_transaction,
    session_factory,
    sqlstate,
    supported_url,
)
from kerneltune.storage._migrate import VERSION_TABLE, head_revisions, is_migrated, migrate
from kerneltune.storage._misses import (
    MAX_MISSES,
    MISS_ROWS,
    MissReport,
    RecordedMiss,
    list_misses,
    record_misses,
    spread_rows,
)
from kerneltune.storage._models import (
    RUN_COUNTS,
    Base,
    Device,
    Miss,
    Result,
    RunStatus,
    TuningRun,
)
from kerneltune.storage._results import (
    UnknownDeviceError,
    entries_for,
    get_result,
    list_devices,
    lock_device,
    results_for,
    upsert_device,
    upsert_result,
    upsert_results,
    validated_entry,
)
from kerneltune.storage._runs import finish_run, latest_run, start_run, update_run
from kerneltune.storage._tables import export_table, import_table, table_etag

__all__ = [
    "CONFLICT_SQLSTATES",
    "ENV_DATABASE_URL",
    "MAX_MISSES",
    "MISS_ROWS",
    "RUN_COUNTS",
    "TRANSACTION_ATTEMPTS",
    "VERSION_TABLE",
    "Base",
    "Device",
    "ErrorKind",
    "Miss",
    "MissReport",
    "RecordedMiss",
    "Result",
    "RunStatus",
    "StoreGoneError",
    "TuningRun",
    "UnknownDeviceError",
    "UnsupportedDatabaseError",
    "configure_sqlite",
    "data_dir",
    "default_database_url",
    "entries_for",
    "error_kind",
    "export_table",
    "finish_run",
    "get_result",
    "head_revisions",
    "import_table",
    "is_migrated",
    "latest_run",
    "list_devices",
    "list_misses",
    "lock_device",
    "make_engine",
    "migrate",
    "normalize_url",
    "record_misses",
    "results_for",
    "retry_delay_s",
    "run_transaction",
    "session_factory",
    "spread_rows",
    "sqlstate",
    "start_run",
    "supported_url",
    "table_etag",
    "update_run",
    "upsert_device",
    "upsert_result",
    "upsert_results",
    "validated_entry",
]
