"""SASS instructions an element in the row loop of quant's split (4K chunks, 4 warps, one row a
block, three stages), compiled for sm_90 without a GPU, for the shipped module and `unpack.py`'s
variants.

    PYTHONPATH=src:benchmarks python \
        benchmarks/results/nvidia-h100-80gb-hbm3/quant-unpack/loop_mix.py

The loop is the longest backward branch of the kernel; its instructions are divided by the 32
elements a thread holds. The variants edit the module of commit 85e8559 (`unpack.BASE`).
"""

from __future__ import annotations

import collections
import importlib.util
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "quant-split"))

import triton
import unpack

from sass_mix import _cubin_tool, hopper_cubin, opcodes

SIG = {"PART_SQ": "*fp32", "PART_MAX": "*fp32", "NQ": "i32", "X": "*bf16", "W": "*bf16",
       "B": "*bf16", "Q": "*i8", "SCALE": "*fp32", "stride_x": "i32", "stride_q": "i32",
       "M": "i32", "N": "i32", "eps": "fp32", "min_scale": "fp32"}
BLOCK, WARPS, PER_SM = 4096, 4, 4


def loop_ops(sass: str) -> list[str]:
    lines = sass.splitlines()
    labels = {line[:-1]: i for i, line in enumerate(lines) if re.match(r"^\.L_x_\d+:$", line)}
    spans = [(i - labels[m.group(1)], labels[m.group(1)], i) for i, line in enumerate(lines)
             if (m := re.search(r"BRA `\((\.L_x_\d+)\)", line)) and labels.get(m.group(1), i) < i]
    _, start, end = max(spans)
    return opcodes("\n".join(lines[start:end + 1]))


def main() -> None:
    print(f"Triton {triton.__version__}, sm_90, {BLOCK}-element chunks, {WARPS} warps")
    unpack.harness.SOURCE = unpack.base_source()
    variants = {"shipped": unpack.harness.SOURCE, "widen": unpack.variant(unpack.SPLIT),
                "carry_x": unpack.variant(unpack.SPLIT + unpack.CARRY_X),
                "carry_xy": unpack.variant(unpack.SPLIT + unpack.CARRY_X + unpack.CARRY_Y)}
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in variants.items():
            path = Path(tmp) / f"quant_{name}.py"
            path.write_text(text)
            spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            for mode, qtype, qmax in ((0, "*i8", 127.0), (1, "*fp8e4nv", 448.0)):
                consts = {"BLOCK_N": BLOCK, "ROWS": 1, "NQ_POW2": 16, "PHASE": 0, "EVICT": True,
                          "MODE": mode, "QMAX": qmax, "HAS_W": True, "HAS_B": False,
                          "SOFT_ROUND": False, "STAGES": 3}
                cubin = hopper_cubin(module._rmsnorm_quant_coop_kernel, {**SIG, "Q": qtype},
                                     consts, WARPS, num_stages=3,
                                     maxnreg=65536 // (PER_SM * WARPS * 32))
                ops = loop_ops(_cubin_tool("nvdisasm", cubin, "-c"))
                per = BLOCK // (32 * WARPS)
                top = collections.Counter(ops).most_common(6)
                print(f"{name} {'int8' if mode == 0 else 'fp8'}: {len(ops) / per:.1f} an element, "
                      f"spills {ops.count('STL') + ops.count('LDL')}; "
                      + ", ".join(f"{op} {n / per:.2f}" for op, n in top))


if __name__ == "__main__":
    main()
