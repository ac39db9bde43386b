"""kerneltune's store: tuned results per GPU model, tuning runs, and the table exchange.

SQLAlchemy models with Alembic migrations, on SQLite (the default, a file in the user's data
directory) or PostgreSQL (shared by many tuning workers). Optuna's studies live in the same
database; its bookkeeping and ours do not collide.

    engine = make_engine()              # KERNELTUNE_DATABASE_URL or the default SQLite file
    migrate(engine)                     # idempotent, safe from many processes at once
    Session = session_factory(engine)
    with Session.begin() as session:    # the functions below never commit: the caller does
        upsert_result(session, "NVIDIA H100 80GB HBM3", entry)

Importing this package imports SQLAlchemy and Alembic; the runtime never does.
"""

from kerneltune.storage._engine import (
    ENV_DATABASE_URL,
    configure_sqlite,
    data_dir,
    default_database_url,
    make_engine,
    normalize_url,
    session_factory,
)
from kerneltune.storage._migrate import VERSION_TABLE, head_revisions, is_migrated, migrate
from kerneltune.storage._models import (
    RUN_COUNTS,
    Base,
    Device,
    Result,
    RunStatus,
    TuningRun,
)
from kerneltune.storage._results import (
    UnknownDeviceError,
    entries_for,
    get_result,
    list_devices,
    results_for,
    upsert_device,
    upsert_result,
    validated_entry,
)
from kerneltune.storage._runs import finish_run, latest_run, start_run, update_run
from kerneltune.storage._tables import export_table, import_table, table_etag

__all__ = [
    "ENV_DATABASE_URL",
    "RUN_COUNTS",
    "VERSION_TABLE",
    "Base",
    "Device",
    "Result",
    "RunStatus",
    "TuningRun",
    "UnknownDeviceError",
    "configure_sqlite",
    "data_dir",
    "default_database_url",
    "entries_for",
    "export_table",
    "finish_run",
    "get_result",
    "head_revisions",
    "import_table",
    "is_migrated",
    "latest_run",
    "list_devices",
    "make_engine",
    "migrate",
    "normalize_url",
    "results_for",
    "session_factory",
    "start_run",
    "table_etag",
    "update_run",
    "upsert_device",
    "upsert_result",
    "validated_entry",
]
