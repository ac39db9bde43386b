"""`benchmarks/device_code.py` run as a script (it compiles for sm_90 with Triton's bundled
tools, no GPU needed): equal configs give equal fingerprints, another config another one, and
`--compare` names the entries that differ."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

from kerneltune import table as tbl

from .script import run_script

ROOT = Path(__file__).resolve().parents[2]


def device_code(*args: str) -> subprocess.CompletedProcess:
    return run_script("device_code.py", *args, interpret=False, check=False)


def test_fingerprints_follow_what_the_gpu_runs(tmp_path):
    shipped = tbl.load(tbl.shipped_table_path("NVIDIA H200"))
    fwd, bwd = (next(e for e in shipped.entries if e.kernel == k and e.m == 16 and e.n == 4096)
                for k in ("rmsnorm_fwd", "rmsnorm_bwd"))
    warps = 2 if fwd.config["num_warps"] != 2 else 4
    other = dataclasses.replace(fwd, config={**fwd.config, "num_warps": warps})
    found = []
    for name, entries in (("a", [fwd, bwd]), ("b", [fwd, bwd]), ("c", [other, bwd])):
        table = tbl.save(dataclasses.replace(shipped, entries=entries),
                         tmp_path / name / "table.json")
        out = tmp_path / f"{name}.json"
        done = device_code(str(out), "--table", str(table))
        assert done.returncode == 0, done.stderr[-3000:]
        found.append(out)
    same = device_code("--compare", str(found[0]), str(found[1]))
    assert same.returncode == 0, same.stdout
    assert "2 of 2 entries identical" in same.stdout
    differ = device_code("--compare", str(found[0]), str(found[2]))
    assert differ.returncode == 1
    assert "differs: table: rmsnorm_fwd bfloat16 n=4096 m=16" in differ.stdout
    assert "rmsnorm_bwd" not in differ.stdout
