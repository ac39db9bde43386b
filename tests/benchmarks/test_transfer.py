"""`transfer.py`: another GPU's picks timed beside this GPU's own and the default, at keys whose
picks differ, each checked first; the summary's ratios are the rows' own."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kerneltune.kernels import REGISTRY
from kerneltune.table import INTERPRETER_DEVICE, Entry, Table
from kerneltune.table import save as save_table

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from transfer import sample_keys, summary, time_key

from .script import run_script

N, M = 96, 2


def entry(kernel: str, config: dict, n: int = N) -> Entry:
    return Entry(kernel, "float32", n=n, m=M, config=config, us=1.0, gbps=1.0, default_us=1.0,
                 trials=1, kernel_hash=REGISTRY[kernel].kernel_hash)


def two_configs(kernel: str) -> list[dict]:
    spec = REGISTRY[kernel]
    problem = spec.problem(M, N, "float32")
    default = spec.default(problem)
    other = next(c for c in spec.configs(problem) if c != default)
    return [default.to_json(), other.to_json()]


def test_borrowed_picks_are_checked_and_timed_beside_the_own(tmp_path) -> None:
    own, theirs = [], []
    for kernel in ("rmsnorm_fwd", "add_rmsnorm_fwd"):
        a, b = two_configs(kernel)
        own.append(entry(kernel, a))
        theirs.append(entry(kernel, b))
    a, _ = two_configs("rmsnorm_bwd")  # one pick shared: counted, not timed
    own.append(entry("rmsnorm_bwd", a))
    theirs.append(entry("rmsnorm_bwd", a))
    save_table(Table(INTERPRETER_DEVICE, entries=own), tmp_path / "own.json")
    save_table(Table("other gpu", entries=theirs), tmp_path / "theirs.json")
    out = tmp_path / "transfer.json"
    run_script("transfer.py", "--own", str(tmp_path / "own.json"), "--source",
               str(tmp_path / "theirs.json"), "--keys", "5", "--out", str(out))
    result = json.loads(out.read_text())
    assert result["device"] == INTERPRETER_DEVICE and result["source"] == "other gpu"
    assert result["same_pick_keys"] == 1
    assert sorted(r["kernel"] for r in result["rows"]) == ["add_rmsnorm_fwd", "rmsnorm_fwd"]
    for row in result["rows"]:
        assert "error" not in row, row
        assert set(row["us"]) == {"own", "borrowed", "default"}
        assert row["borrowed_over_own"] == pytest.approx(row["us"]["borrowed"] / row["us"]["own"])
        assert row["configs"]["own"] != row["configs"]["borrowed"]
    assert result["summary"]["timed"] == 2


def test_keys_are_sampled_across_kernels_and_bounded() -> None:
    own = [entry(k, two_configs(k)[0], n) for k in ("rmsnorm_fwd", "rmsnorm_bwd")
           for n in (N, 2 * N, 4 * N)]
    theirs = [entry(k, two_configs(k)[1], n) for k in ("rmsnorm_fwd", "rmsnorm_bwd")
              for n in (N, 2 * N, 4 * N)]
    pairs, same = sample_keys(Table("a", entries=own), Table("b", entries=theirs), 4)
    assert same == 0 and len(pairs) == 4
    assert {a.kernel for a, _ in pairs} == {"rmsnorm_fwd", "rmsnorm_bwd"}
    assert all(a.key == b.key for a, b in pairs)


def test_summary_names_the_worst_key() -> None:
    rows = [{"kernel": "k", "n": n, "m": 1, "us": {"own": 1.0, "borrowed": r, "default": d},
             "borrowed_over_own": r, "default_over_own": d}
            for n, r, d in ((1, 1.0, 1.3), (2, 1.5, 1.2), (3, 1.01, 0.9))]
    s = summary([*rows, {"kernel": "k", "n": 4, "m": 1, "error": "not valid here: own"}])
    assert s["timed"] == 3 and s["errors"] == 1
    assert s["borrowed_over_own_median"] == 1.01 and s["borrowed_over_own_worst"] == 1.5
    assert s["worst_key"] == {"kernel": "k", "n": 2, "m": 1}
    assert s["within_2pct"] == 2 and s["borrowed_faster_than_default"] == 1


def test_a_gpus_own_table_is_no_source(tmp_path) -> None:
    save_table(Table(INTERPRETER_DEVICE), tmp_path / "own.json")
    done = run_script("transfer.py", "--own", str(tmp_path / "own.json"), "--source",
                      str(tmp_path / "own.json"), "--out", str(tmp_path / "t.json"), check=False)
    assert done.returncode == 2 and "own table: name another GPU's" in done.stderr


def test_a_borrowed_pick_this_gpu_refuses_is_an_error_row_not_timed() -> None:
    own, _ = two_configs("rmsnorm_fwd")
    refused = {**own, "BLOCK_N": 3}  # not a power of two: outside the space
    row = time_key(entry("rmsnorm_fwd", own), entry("rmsnorm_fwd", refused), "cpu")
    assert row["error"] == "not valid here: borrowed"
    assert row["configs"]["borrowed"] is None and "us" not in row
