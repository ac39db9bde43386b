"""The other GPUs' tables this machine has, for a key this GPU has no entry for.

`kerneltune.resolution.resolve` takes them after this GPU's own tables' same-shape entries and
before a nearer shape of its own (`transfer`); `kerneltune.resolution.rank_transfers` orders
them, nearest GPU first. They are the machine's own tables of other GPUs (`local`), then the
tables shipped with the package. `KERNELTUNE_TRANSFER=0` turns borrowing off.
"""

from __future__ import annotations

import os
from pathlib import Path

from kerneltune.runtime import local
from kerneltune.runtime.sources import LoadedTable, _brief, warn_once
from kerneltune.table import INTERPRETER_DEVICE, load, shipped_tables_dir

ENV_TRANSFER = "KERNELTUNE_TRANSFER"


def enabled() -> bool:
    """Whether a key this GPU has no entry for may borrow another GPU's (KERNELTUNE_TRANSFER,
    on unless 0, false, no or off)."""
    return os.environ.get(ENV_TRANSFER, "").strip().lower() not in ("0", "false", "no", "off")


def transfer_tables(device: str) -> list[LoadedTable]:
    """The other GPUs' tables this machine has, local ones first. None under the interpreter,
    whose timings are no GPU's, and none taken from it."""
    if device == INTERPRETER_DEVICE or not enabled():
        return []
    files: list[tuple[str, Path]] = []
    try:
        files += [("local", p) for p in sorted((local.data_dir() / local.TABLES).glob("*.json"))]
    except OSError as e:
        warn_once("transfer:local", f"kerneltune: cannot list the local tables: {_brief(e)}")
    files += [("shipped", p) for p in sorted(shipped_tables_dir().glob("*.json"))]
    found = []
    for source, path in files:
        try:
            table = load(path)
        except Exception as e:  # as for this GPU's tables: a bad file costs a warning, not a call
            warn_once(f"file:{path}", f"kerneltune: cannot use table {path}: {_brief(e)}; "
                      "ignoring it")
            continue
        if table.device not in (device, INTERPRETER_DEVICE):
            found.append(LoadedTable(source, str(path), table))
    return found
