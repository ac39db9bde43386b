"""`benchmarks/result_files.py`: a result file is replaced whole, or not at all."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from result_files import write_json


def test_a_result_is_replaced_whole_and_no_temporary_is_left(tmp_path) -> None:
    out = tmp_path / "result.json"
    write_json(out, {"rows": [1]})
    write_json(out, {"rows": [1, 2]}, indent=None)
    assert json.loads(out.read_text()) == {"rows": [1, 2]}
    assert out.read_text() == '{"rows": [1, 2]}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_a_write_stopped_midway_leaves_the_last_result(tmp_path, monkeypatch) -> None:
    out = tmp_path / "result.json"
    write_json(out, {"rows": [1]})
    write_text = Path.write_text

    def half_then_fail(self: Path, text: str) -> int:  # as a process killed mid-write
        write_text(self, text[: len(text) // 2])
        raise OSError("no space left on device")

    monkeypatch.setattr(Path, "write_text", half_then_fail)
    with pytest.raises(OSError):
        write_json(out, {"rows": [1, 2, 3]})
    monkeypatch.undo()
    assert json.loads(out.read_text()) == {"rows": [1]}
