"""Result files written whole: the data goes to a temporary file beside the result, which then
replaces it, so a run stopped mid-write (a time limit, a killed process) leaves the file as it
last was, never half of it. Kept free of kerneltune imports: the scripts that use it also run
against older commits' sources."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: str | Path, data: Any, indent: int | None = 1) -> None:
    """`data` as JSON at `path`, replacing what was there at once."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=indent) + "\n")
    tmp.replace(path)
