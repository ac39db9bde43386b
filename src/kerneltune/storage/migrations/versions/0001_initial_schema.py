"""Initial schema: devices, tuning runs and results.

Revision ID: 0001
Revises:
Create Date: 2026-05-09
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def _env_columns() -> list[sa.Column]:
    return [sa.Column(name, sa.String(64), nullable=True)
            for name in ("triton", "torch", "cuda", "driver", "python")]


def upgrade() -> None:
    op.create_table(
        "devices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("compute_capability", sa.String(16), nullable=True),
        sa.Column("sm_count", sa.Integer(), nullable=True),
        sa.Column("copy_gbps", sa.Double(), nullable=True),
        sa.Column("first_seen", _TS, nullable=False),
        sa.Column("last_seen", _TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_devices"),
        sa.UniqueConstraint("name", name="uq_devices_name"),
    )
    op.create_table(
        "tuning_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("started_at", _TS, nullable=False),
        sa.Column("finished_at", _TS, nullable=True),
        sa.Column("host", sa.String(255), nullable=True),
        sa.Column("username", sa.String(255), nullable=True),
        sa.Column("worker", sa.String(255), nullable=True),
        *_env_columns(),
        sa.Column("sampler", sa.String(64), nullable=False),
        sa.Column("trials_per_key", sa.Integer(), nullable=True),
        sa.Column("time_budget_s", sa.Double(), nullable=True),
        sa.Column(
            "status",
            sa.Enum("running", "done", "failed", "interrupted", name="run_status",
                    native_enum=False, create_constraint=True, length=16),
            nullable=False,
        ),
        sa.Column("keys_total", sa.Integer(), nullable=True),
        sa.Column("keys_done", sa.Integer(), nullable=False),
        sa.Column("keys_failed", sa.Integer(), nullable=False),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("trials_pruned", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"],
                                name="fk_tuning_runs_device_id_devices", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_tuning_runs"),
    )
    op.create_index("ix_tuning_runs_device_id", "tuning_runs", ["device_id"])
    op.create_table(
        "results",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("kernel", sa.String(64), nullable=False),
        sa.Column("dtype", sa.String(16), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("m", sa.Integer(), nullable=False),
        sa.Column("config", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("us", sa.Double(), nullable=False),
        sa.Column("gbps", sa.Double(), nullable=False),
        sa.Column("frac_copy", sa.Double(), nullable=True),
        sa.Column("default_us", sa.Double(), nullable=False),
        sa.Column("default_config", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("kernel_hash", sa.String(128), nullable=False),
        *_env_columns(),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("fingerprint", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"],
                                name="fk_results_device_id_devices", ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["run_id"], ["tuning_runs.id"],
                                name="fk_results_run_id_tuning_runs", ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name="pk_results"),
        sa.UniqueConstraint("device_id", "kernel", "dtype", "n", "m",
                            name="uq_results_device_id_kernel_dtype_n_m"),
    )
    op.create_index("ix_results_run_id", "results", ["run_id"])
    op.create_index("ix_results_device_id_fingerprint", "results", ["device_id", "fingerprint"])


def downgrade() -> None:
    op.drop_index("ix_results_device_id_fingerprint", table_name="results")
    op.drop_index("ix_results_run_id", table_name="results")
    op.drop_table("results")
    op.drop_index("ix_tuning_runs_device_id", table_name="tuning_runs")
    op.drop_table("tuning_runs")
    op.drop_table("devices")
