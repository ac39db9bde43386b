"""The keys models ran untuned, as their runtimes report them (`misses`); every GPU's result
at one shape found by an index (what a transfer between GPUs looks at).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "misses",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("device", sa.String(length=200), nullable=False),
        sa.Column("kernel", sa.String(length=64), nullable=False),
        sa.Column("dtype", sa.String(length=16), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("m", sa.Integer(), nullable=False),
        sa.Column("processes", sa.BigInteger(), nullable=False),
        sa.Column("rows", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_misses")),
        sa.UniqueConstraint("device", "kernel", "dtype", "n", "m",
                            name=op.f("uq_misses_device_kernel_dtype_n_m")),
    )


    op.create_index(op.f("ix_results_kernel_n_m_dtype"), "results",
                    ["kernel", "n", "m", "dtype"])


def downgrade() -> None:
    op.drop_index(op.f("ix_results_kernel_n_m_dtype"), table_name="results")
    op.drop_table("misses")
