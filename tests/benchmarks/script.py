"""Run a tool of `benchmarks/` as a script, against this checkout's `src`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_script(name: str, *args: str, interpret: bool = True, check: bool = True
               ) -> subprocess.CompletedProcess:
    """`benchmarks/<name>` with `args`, under the Triton interpreter unless `interpret` is
    False (a tool that compiles for a GPU); with `check`, its exit status must be 0."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *args], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done
