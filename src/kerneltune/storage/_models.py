"""The store's schema: GPU models, tuning runs and the best result per tuning key.

Table names are plain (`devices`, `tuning_runs`, `results`); Optuna's tables share the database and
none of its names collide with these. Changing a model means adding an Alembic revision under
`migrations/versions/`.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Double,
    Enum,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from kerneltune.table import Entry, Env

# Deterministic constraint names, so migrations can refer to them on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: The columns of a tuning key, in the order of the unique constraint on `results`.
RESULT_KEY = ("device_id", "kernel", "dtype", "n", "m")
#: Software versions recorded with every run and every result (the fields of `table.Env`).
ENV_FIELDS = tuple(Env.__dataclass_fields__)
#: The counters a tuning run keeps.
RUN_COUNTS = ("keys_total", "keys_done", "keys_failed", "trials", "trials_pruned")


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(moment: datetime | None) -> datetime | None:
    """SQLite hands timestamps back without a zone; they were written in UTC."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


class RunStatus(enum.StrEnum):
    running = "running"
    done = "done"
    failed = "failed"
    interrupted = "interrupted"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _json() -> JSON:
    # SQL NULL for None (not the JSON text 'null'), so `IS NULL` means "absent".
    return JSON(none_as_null=True)


class Device(Base):
    """A GPU model as the driver names it (all boards of one model share a table)."""

    __tablename__ = "devices"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    compute_capability: Mapped[str | None] = mapped_column(String(16))
    sm_count: Mapped[int | None] = mapped_column(Integer)
    #: Measured device-to-device copy bandwidth, bytes read plus written, GB/s.
    copy_gbps: Mapped[float | None] = mapped_column(Double)
    first_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    runs: Mapped[list[TuningRun]] = relationship(back_populates="device", passive_deletes=True)

    def __repr__(self) -> str:
        return f"Device(id={self.id}, name={self.name!r})"


class TuningRun(Base):
    """One invocation of the tuner on one device (or one import of a table)."""

    __tablename__ = "tuning_runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(
        ForeignKey("devices.id", ondelete="CASCADE"), index=True
    )
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    host: Mapped[str | None] = mapped_column(String(255))
    user: Mapped[str | None] = mapped_column("username", String(255))
    worker: Mapped[str | None] = mapped_column(String(255))
    triton: Mapped[str | None] = mapped_column(String(64))
    torch: Mapped[str | None] = mapped_column(String(64))
    cuda: Mapped[str | None] = mapped_column(String(64))
    driver: Mapped[str | None] = mapped_column(String(64))
    python: Mapped[str | None] = mapped_column(String(64))
    #: "tpe", "brute", ..., or "import" for a table brought in from a file.
    sampler: Mapped[str] = mapped_column(String(64))
    trials_per_key: Mapped[int | None] = mapped_column(Integer)
    time_budget_s: Mapped[float | None] = mapped_column(Double)
    status: Mapped[RunStatus] = mapped_column(
        Enum(
            RunStatus,
            name="run_status",
            native_enum=False,
            create_constraint=True,
            length=16,
            values_callable=lambda e: [m.value for m in e],
        ),
        default=RunStatus.running,
    )
    keys_total: Mapped[int | None] = mapped_column(Integer)
    keys_done: Mapped[int] = mapped_column(Integer, default=0)
    keys_failed: Mapped[int] = mapped_column(Integer, default=0)
    trials: Mapped[int] = mapped_column(Integer, default=0)
    trials_pruned: Mapped[int] = mapped_column(Integer, default=0)

    device: Mapped[Device] = relationship(back_populates="runs")

    @property
    def env(self) -> Env:
        return Env(**{f: getattr(self, f) for f in ENV_FIELDS})


class Result(Base):
    """The best config known for one tuning key (device, kernel, dtype, n, m bucket)."""

    __tablename__ = "results"
    __table_args__ = (
        UniqueConstraint(*RESULT_KEY),
        # Covers the ETag's per-device sum of fingerprints (an index-only scan).
        Index(None, "device_id", "fingerprint"),
        # Every GPU's result at one shape: what a transfer between GPUs looks at.
        Index(None, "kernel", "n", "m", "dtype"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"))
    kernel: Mapped[str] = mapped_column(String(64))
    dtype: Mapped[str] = mapped_column(String(16))
    n: Mapped[int] = mapped_column(Integer)
    m: Mapped[int] = mapped_column(Integer)
    config: Mapped[dict[str, Any]] = mapped_column(_json())
    us: Mapped[float] = mapped_column(Double)
    gbps: Mapped[float] = mapped_column(Double)
    frac_copy: Mapped[float | None] = mapped_column(Double)
    default_us: Mapped[float] = mapped_column(Double)
    default_config: Mapped[dict[str, Any] | None] = mapped_column(_json())
    trials: Mapped[int] = mapped_column(Integer)
    kernel_hash: Mapped[str] = mapped_column(String(128))
    triton: Mapped[str | None] = mapped_column(String(64))
    torch: Mapped[str | None] = mapped_column(String(64))
    cuda: Mapped[str | None] = mapped_column(String(64))
    driver: Mapped[str | None] = mapped_column(String(64))
    python: Mapped[str | None] = mapped_column(String(64))
    run_id: Mapped[int | None] = mapped_column(
        ForeignKey("tuning_runs.id", ondelete="SET NULL"), index=True
    )
    #: A 40-bit hash of the entry as written; their sum per device fingerprints a table (ETag).
    fingerprint: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    device: Mapped[Device] = relationship()

    @property
    def env(self) -> Env | None:
        env = Env(**{f: getattr(self, f) for f in ENV_FIELDS})
        return None if env == Env() else env

    def to_entry(self) -> Entry:
        """The table entry this row stores (the one conversion from rows to entries)."""
        return Entry(
            kernel=self.kernel,
            dtype=self.dtype,
            n=self.n,
            m=self.m,
            config=dict(self.config),
            us=self.us,
            gbps=self.gbps,
            default_us=self.default_us,
            trials=self.trials,
            kernel_hash=self.kernel_hash,
            frac_copy=self.frac_copy,
            default_config=None if self.default_config is None else dict(self.default_config),
            env=self.env,
        )

    def __repr__(self) -> str:
        return (
            f"Result(device_id={self.device_id}, kernel={self.kernel!r}, dtype={self.dtype!r}, "
            f"n={self.n}, m={self.m}, us={self.us})"
        )


class Miss(Base):
    """A tuning key that models running on a GPU model resolved other than exactly, as their
    runtimes reported it: how many processes met it, and a sample of the row counts they met.

    Keyed by the GPU's name, not a `devices` row: a GPU that only reports is not a GPU with a
    table (`/api/v1/gpus` lists those).
    """

    __tablename__ = "misses"
    __table_args__ = (UniqueConstraint("device", "kernel", "dtype", "n", "m"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    device: Mapped[str] = mapped_column(String(200))
    kernel: Mapped[str] = mapped_column(String(64))
    dtype: Mapped[str] = mapped_column(String(16))
    n: Mapped[int] = mapped_column(Integer)
    m: Mapped[int] = mapped_column(Integer)
    processes: Mapped[int] = mapped_column(BigInteger)
    #: Distinct row counts met, sorted, at most `MISS_ROWS` of them.
    rows: Mapped[list[int]] = mapped_column(_json())
    first_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
