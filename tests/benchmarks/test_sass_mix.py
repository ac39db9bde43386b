"""`sass_mix.py` compiles kerneltune's whole-row kernels for sm_90 with Triton's CUDA backend, no
GPU needed, and counts their SASS: run as a script, and its helpers in a process that compiles
for a GPU (it refuses the interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _compile_env() -> dict[str, str]:
    """The environment of a process that compiles for a GPU (not under the interpreter)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    return env


def test_sass_mix_counts_instructions_per_element_offline():
    env = _compile_env()
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sass_mix.py"), "--kernels", "rmsnorm_fwd",
         "rmsnorm_quant_fwd", "rmsnorm_bwd", "--block", "1024", "--warps", "1", "2", "--n", "640",
         "1024"],
        env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    header, *lines = done.stdout.splitlines()
    assert header.startswith("sm_90 SASS from Triton ")
    per_element = {}
    for line in lines:
        name, _, rest = line.partition(" BLOCK_N=1024: ")
        per_element[name] = float(rest.split(" instructions per element")[0])
    # quantising costs instructions on top of the normalisation the forward does
    assert 0 < per_element["rmsnorm_fwd"] < per_element["rmsnorm_quant_fwd"]
    # the backward (its kernel typed as it is launched) reads two tensors and sums dw as well
    assert per_element["rmsnorm_fwd"] < per_element["rmsnorm_bwd"]
    refused = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sass_mix.py")],
                             env={**env, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
                             check=False)
    assert refused.returncode != 0 and "unset TRITON_INTERPRET" in refused.stderr


def _sass_mix_prints(code: str) -> str:
    """What `code` prints, run with `benchmarks/` importable in a process that compiles for a
    GPU."""
    script = "import sys; sys.path.insert(0, sys.argv[1])\n" + code
    done = subprocess.run([sys.executable, "-c", script, str(ROOT / "benchmarks")],
                          env=_compile_env(), capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_quant_int8_needs_no_conversion_or_clamp_instructions_offline():
    """int8 is stored as the low byte of a fused multiply-add, unclamped: the whole-row
    kernel's sm_90 SASS has no float -> int conversion, and fewer FMNMX than two an element
    (the row's max takes about one; each clamp took one more)."""
    printed = _sass_mix_prints("from sass_mix import sass_counts\n"
                               "c = sass_counts('rmsnorm_quant_fwd', 1024, 1)\n"
                               "print(c['F2I'], c['FMNMX'])")
    conversions, min_max = (int(v) for v in printed.split())
    elements = 1024 // 32  # per thread, one warp
    assert conversions == 0
    assert min_max < 2 * elements


@pytest.mark.parametrize("kernel", ["rmsnorm_fwd", "add_rmsnorm_fwd", "rmsnorm_quant_fwd",
                                    "rmsnorm_bwd"])
def test_whole_row_kernels_wait_before_any_access_and_release_after_their_loads_offline(kernel):
    """With PDL a whole-row kernel (sm_90 SASS) waits for the grid before it (ACQBULK) ahead of
    its first global load or store, and releases the next grid (PREEXIT) after its last load
    but ahead of its last store (y, q, or the backward's dw); without PDL it does neither."""
    printed = _sass_mix_prints(
        "from sass_mix import sass_opcodes\n"
        f"for pdl in (True, False): print(*sass_opcodes({kernel!r}, 1024, 2, PDL=pdl))")
    with_pdl, without = (line.split() for line in printed.splitlines())
    loads = [i for i, op in enumerate(with_pdl) if op == "LDG"]
    stores = [i for i, op in enumerate(with_pdl) if op == "STG"]
    assert with_pdl.count("ACQBULK") == 1 and with_pdl.count("PREEXIT") == 1
    assert with_pdl.index("ACQBULK") < min(loads + stores)
    assert max(loads) < with_pdl.index("PREEXIT") < max(stores)
    assert "ACQBULK" not in without and "PREEXIT" not in without
    assert "LDG" in without
