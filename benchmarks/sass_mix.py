"""Instructions per element of kerneltune's whole-row kernels, compiled for Hopper without a GPU.

A memory-bound kernel reaches the copy bandwidth only if its SMs issue its instructions faster
than memory delivers its elements. This compiles the single-pass (whole row in registers) path of
the forward, add + norm, quant and backward kernels for sm_90 with Triton's CUDA backend (no
device needed), disassembles the cubin and counts SASS instructions per thread at two warp
counts: the difference is the cost of the extra elements a thread holds, so it gives the
instructions per element apart from the per-row overhead (reductions, addressing, the row's
scalars). Spills to local memory (STL, LDL) are counted apart: a whole row that does not fit
its threads' registers shows there.

The ceiling printed is issue-bound: an SM issues one warp instruction per clock in each of its 4
sub-partitions (128 thread instructions a clock), so a kernel needing I instructions per
element processes at most 128 / I elements a clock per SM, of which a block padded to the next
power of two wastes 1 - N / BLOCK_N. Against it, memory delivers `copy_gbps / bytes` elements a
second. These are counts and arithmetic, not timings: a GPU run decides.

    python benchmarks/sass_mix.py --block 4096 --n 2560 4096
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kerneltune.kernels import add_rmsnorm, rmsnorm_bwd, rmsnorm_fwd, rmsnorm_quant

#: NVIDIA H200: SMs, boost clock (GHz), copy bandwidth measured by the tuner (GB/s).
H200 = {"sms": 132, "ghz": 1.98, "copy_gbps": 4282.0}
ISSUE_PER_CLOCK = 128  # 4 sub-partitions x one 32-thread instruction
POINTERS_ALIGNED = 16  # what Triton assumes of tensors from the caching allocator


def _kernel(name: str, block: int) -> tuple[Any, dict[str, str], dict[str, Any], int]:
    """(jit function, signature, constants, bytes per element) of one kernel's whole-row path
    in bf16 (int8 out for quant), as a programmatic dependent launch."""
    if name == "rmsnorm_fwd":
        sig = {"X": "*bf16", "W": "*bf16", "Y": "*bf16", "RSTD": "*fp32", "stride_x": "i32",
               "stride_y": "i32", "M": "i32", "N": "i32", "eps": "fp32", "offset": "fp32"}
        consts = {"BLOCK_N": block, "ROWS": 1, "SINGLE": True, "GEMMA": False, "EVICT": True,
                  "PERSIST": False, "PDL": True, "LATE_RELEASE": False}
        return rmsnorm_fwd._rmsnorm_fwd_kernel, sig, consts, 4
    if name == "add_rmsnorm_fwd":
        sig = {"X": "*bf16", "RES": "*bf16", "W": "*bf16", "Y": "*bf16", "S": "*bf16",
               "RSTD": "*fp32", "stride_x": "i32", "stride_res": "i32", "stride_y": "i32",
               "stride_s": "i32", "M": "i32", "N": "i32", "eps": "fp32", "offset": "fp32"}
        consts = {"BLOCK_N": block, "ROWS": 1, "SINGLE": True, "GEMMA": False, "EVICT": True,
                  "SOFT_ROUND": False, "PERSIST": False, "PDL": True}
        return add_rmsnorm._add_rmsnorm_fwd_kernel, sig, consts, 8
    if name == "rmsnorm_quant_fwd":
        sig = {"X": "*bf16", "W": "*bf16", "B": "*bf16", "Q": "*i8", "SCALE": "*fp32",
               "stride_x": "i32", "stride_q": "i32", "M": "i32", "N": "i32", "eps": "fp32",
               "min_scale": "fp32"}
        consts = {"BLOCK_N": block, "TAIL": 0, "ROWS": 1, "SINGLE": True, "PERSIST": False,
                  "EVICT": True, "MODE": 0, "QMAX": 127.0, "HAS_W": True, "HAS_B": False,
                  "SOFT_ROUND": False, "X_LAYOUT": False, "PDL": True}
        return rmsnorm_quant._rmsnorm_quant_kernel, sig, consts, 3
    if name == "rmsnorm_bwd":
        sig = {"DY": "*bf16", "X": "*bf16", "W": "*bf16", "RSTD": "*fp32", "DX": "*bf16",
               "DW_PART": "*fp32", "DW": "*bf16", "stride_dy": "i32", "stride_x": "i32",
               "stride_dx": "i32", "M": "i32", "N": "i32", "offset": "fp32"}
        consts = {"BLOCK_N": block, "ROWS": 1, "SINGLE": True, "PREFETCH": False,
                  "DW_REGS": True, "DIRECT": False, "GEMMA": False, "READ_ONCE": "",
                  "READ_TWICE": "", "PDL": True}
        return rmsnorm_bwd._rmsnorm_bwd_kernel, sig, consts, 6
    raise ValueError(f"unknown kernel {name!r}")


def hopper_cubin(fn: Any, sig: dict[str, str], consts: dict[str, Any], warps: int,
                 **options: Any) -> bytes:
    """A Triton kernel compiled for sm_90 (no GPU needed), one stage unless `options` say.

    `sig` types the runtime arguments; pointers, strides and N are taken divisible by 16, as
    Triton specialises them for these tables' N. `options` are further launch options
    (maxnreg)."""
    signature = {**sig, **dict.fromkeys(consts, "constexpr")}
    aligned = [i for i, (k, v) in enumerate(sig.items())
               if v.startswith("*") or k == "N" or k.startswith("stride")]
    attrs = {(i,): [["tt.divisibility", POINTERS_ALIGNED]] for i in aligned}
    return hopper_compile(fn, signature, consts, attrs,
                          {"num_warps": warps, "num_stages": 1, **options})


def hopper_compile(fn: Any, signature: dict[str, str], consts: dict[str, Any],
                   attrs: dict[tuple[int, ...], list], options: dict[str, Any]) -> bytes:
    """The cubin of a Triton kernel compiled for sm_90 with Triton's CUDA backend (no GPU
    needed), its signature, constants, specialisation attributes and options as given."""
    compiled = triton.compile(ASTSource(fn, signature, consts, attrs),
                              target=GPUTarget("cuda", 90, 32), options=options)
    return compiled.asm["cubin"]


def _cubin_tool(tool: str, cubin: bytes, *args: str) -> str:
    """The output of one of Triton's bundled CUDA binary tools on `cubin`."""
    path = Path(triton.__file__).parent / "backends/nvidia/bin" / tool
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        return subprocess.run([str(path), *args, fh.name], capture_output=True, text=True,
                              check=True).stdout


def hopper_sass(fn: Any, sig: dict[str, str], consts: dict[str, Any], warps: int,
                **options: Any) -> str:
    """The SASS of a Triton kernel compiled for sm_90 (`hopper_cubin`)."""
    return _cubin_tool("nvdisasm", hopper_cubin(fn, sig, consts, warps, **options), "-c")


def hopper_registers(fn: Any, sig: dict[str, str], consts: dict[str, Any], warps: int,
                     **options: Any) -> int:
    """Registers per thread of a Triton kernel compiled for sm_90 (`hopper_cubin`)."""
    usage = _cubin_tool("cuobjdump", hopper_cubin(fn, sig, consts, warps, **options),
                        "--dump-resource-usage")
    found = re.search(r"REG:(\d+)", usage)
    if found is None:
        raise RuntimeError(f"cuobjdump printed no register count for {fn.__name__}: {usage!r}")
    return int(found.group(1))


def opcodes(sass: str) -> list[str]:
    """The opcodes (no modifiers) of `nvdisasm` output, in program order."""
    found = (re.search(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
             for line in sass.splitlines())
    return [m.group(1) for m in found if m]


def sass_opcodes(name: str, block: int, warps: int, **consts: Any) -> list[str]:
    """SASS opcodes of one compiled kernel (sm_90) in program order; `consts` override the
    kernel's constants."""
    fn, sig, base, _ = _kernel(name, block)
    return opcodes(hopper_sass(fn, sig, {**base, **consts}, warps))


def sass_counts(name: str, block: int, warps: int) -> collections.Counter[str]:
    """SASS opcodes of one compiled kernel (sm_90), counted."""
    return collections.Counter(sass_opcodes(name, block, warps))


def per_element(name: str, block: int, warps: tuple[int, int]) -> dict[str, Any]:
    """Instructions per element (the marginal cost between two warp counts) and per thread."""
    few, many = sorted(warps)
    lo, hi = sass_counts(name, block, few), sass_counts(name, block, many)
    extra = block // (32 * few) - block // (32 * many)  # elements more per thread at `few`
    marginal = {op: (lo[op] - hi[op]) / extra for op in lo if lo[op] > hi[op]}
    return {"kernel": name, "block": block, "warps": [few, many],
            "per_thread": {few: sum(lo.values()), many: sum(hi.values())},
            "spills": {few: lo["STL"] + lo["LDL"], many: hi["STL"] + hi["LDL"]},
            "per_element": sum(marginal.values()),
            "top": sorted(marginal.items(), key=lambda kv: -kv[1])[:10],
            "bytes": _kernel(name, block)[3]}


def ceiling(result: dict[str, Any], n: int, *, overhead: bool, gpu: dict[str, float] = H200
            ) -> float:
    """Issue-bound fraction of copy bandwidth at N (<= 1): from the per-element cost alone, or
    with the per-row overhead of the fewer-warps compile spread over its elements."""
    few = result["warps"][0]
    per_element = (result["per_thread"][few] / (result["block"] // (32 * few)) if overhead
                   else result["per_element"])
    issue = ISSUE_PER_CLOCK / per_element * n / result["block"]  # useful elements a clock
    memory = gpu["copy_gbps"] * 1e9 / result["bytes"] / (gpu["sms"] * gpu["ghz"] * 1e9)
    return min(1.0, issue / memory)


def main() -> None:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("sass_mix.py compiles for a GPU: unset TRITON_INTERPRET")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", nargs="+",
                    default=["rmsnorm_fwd", "rmsnorm_quant_fwd", "rmsnorm_bwd"])
    ap.add_argument("--block", type=int, default=4096)
    ap.add_argument("--warps", type=int, nargs=2, default=[2, 4])
    ap.add_argument("--n", type=int, nargs="+", default=[2560, 4096])
    args = ap.parse_args()
    print(f"sm_90 SASS from Triton {triton.__version__} (the GPU image's Triton may differ)")
    for name in args.kernels:
        r = per_element(name, args.block, tuple(args.warps))
        top = ", ".join(f"{op} {v:.2f}" for op, v in r["top"])
        ceilings = ", ".join(
            f"N={n}: {ceiling(r, n, overhead=False):.2f} / {ceiling(r, n, overhead=True):.2f}"
            for n in args.n if n <= r["block"])
        print(f"{name} BLOCK_N={r['block']}: {r['per_element']:.1f} instructions per element "
              f"({top}); per thread {r['per_thread']}, of which local-memory spills "
              f"{r['spills']}; issue-bound fraction of copy on an H200 "
              f"(per element / with the row's overhead at {r['warps'][0]} warps) {ceilings}")


if __name__ == "__main__":
    main()
