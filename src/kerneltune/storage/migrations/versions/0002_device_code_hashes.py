"""Kernel hashes cover the device code only.

Each kernel's module was split in two: the Triton kernels with their launcher (hashed), and the
spec with the reference, the check, the search space and the default (no longer hashed). The
device code did not change, so results and studies measured on it are renamed to the new hash
rather than made stale.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

from kerneltune.storage._migrate import rename_kernel_hashes

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Hash of the whole module -> hash of the same device code in its own module, per kernel.
RENAMED = {
    "b9f3cee4a660c085": "5eaba3b3b7c1e9bb",  # rmsnorm_fwd
    "0b072d11ce3e8d4f": "bcad65b2cd67545e",  # rmsnorm_bwd
    "ef2549c43d5f0984": "246f70f3aa971386",  # add_rmsnorm_fwd
    "75e159f49d297e72": "65d88902fb6b6cca",  # rmsnorm_quant_fwd
}


def upgrade() -> None:
    rename_kernel_hashes(RENAMED)


def downgrade() -> None:
    rename_kernel_hashes({new: old for old, new in RENAMED.items()})
