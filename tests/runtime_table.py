"""The runtime on a test GPU of its own, reading one table file and nothing else."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from kerneltune import env, runtime
from kerneltune.runtime import sources, transfer


@contextlib.contextmanager
def runtime_on_table(tmp: Path, gpu: str) -> Iterator[Path]:
    """The path of the runtime's only source (KERNELTUNE_TABLE; no service, no shipped table,
    no other GPU's) while the runtime believes it runs on `gpu`; the runtime is reset
    afterwards."""
    path = tmp / "table.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(sources.ENV_URL, raising=False)
        mp.setenv(sources.ENV_TABLE, str(path))
        mp.setenv(sources.ENV_CACHE_DIR, str(tmp / "cache"))
        mp.setattr(env, "device_name", lambda index=None: gpu)
        mp.setattr(sources, "shipped_table_path", lambda device: tmp / "none.json")
        mp.setattr(transfer, "shipped_tables_dir", lambda: tmp / "none")  # nothing to transfer
        yield path
    runtime.reset()
