"""Kernels compiled for Hopper without a GPU: a script run in a fresh process, off the
interpreter, with `benchmarks/` (its `sass_mix` helpers) as its first argument."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def compiled_offline(script: str) -> str:
    """The output of `script` compiling for Hopper with `benchmarks/` importable (not under
    the interpreter)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", script, str(ROOT / "benchmarks")],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
