"""Fingerprints of the device code a config launches, compiled for sm_90 without a GPU.

A kernel module's hash changes with any edit, docstrings included, so it cannot say whether a
result measured on an earlier commit still stands for the shipped code. This runs a spec's
launcher with every `kernel[grid](...)` recorded instead of launched (as an H100 would launch
it: 132 SMs, programmatic dependent launch), compiles each recorded launch with Triton's CUDA
backend for sm_90, and hashes its grid and SASS (`nvdisasm`, comments and section headers
dropped). Equal fingerprints: the same grids, and the same instructions in the same order, for
every kernel of the call.

    PYTHONPATH=src python benchmarks/device_code.py suite.json out.json [--src DIR] [--part P] \
        [--kernel K] [--table T]

prints and writes, for every kerneltune row of a merged suite (`merge_bench.py`) whose key the
table (`--table`, the shipped H100 one by default) holds, the fingerprint of its config, computed
with the package under DIR (default: this checkout's `src`). Run it once with the `src` of the
commit that added a part (`git archive REV src | tar -x -C DIR`) and once with HEAD's, and
compare.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

#: What the launchers are told about the device: an H100's SMs, and dependent launches.
SMS = 132
TYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32",
         "torch.int8": "i8", "torch.float8_e4m3fn": "fp8e4nv", "torch.int32": "i32",
         "torch.int64": "i64", "torch.uint8": "u8"}
#: Launch options that change what is compiled.
COMPILE_OPTIONS = ("num_warps", "num_stages", "maxnreg")


def _as_h100(modules: list[Any]) -> None:
    """Every loaded kernel module sees a compiled H100: not the interpreter, 132 SMs, PDL."""
    for module in modules:
        for name, value in (("interpreting", lambda: False), ("sm_count", lambda device: SMS),
                            ("dependent_launch", lambda device: True)):
            if hasattr(module, name):
                setattr(module, name, value)


def _meta_inputs(spec: Any, problem: Any) -> dict[str, Any]:
    """The problem's inputs as tensors without storage (their shapes, strides and dtypes are all
    a launch records): made for 3 rows and for 4, then each dimension that differs between the
    two given the problem's M (a dimension of N keeps its size, whatever N is)."""
    import torch

    three, four = (spec.make_inputs(dataclasses.replace(problem, m=m), 0, "cpu") for m in (3, 4))
    return {k: torch.empty(tuple(problem.m if a != b else a
                                 for a, b in zip(v.shape, four[k].shape, strict=True)),
                           dtype=v.dtype, device="meta") if isinstance(v, torch.Tensor) else v
            for k, v in three.items()}


Launch = tuple[Any, tuple[int, ...], tuple, dict]


def recorded_launches(spec: Any, problem: Any, config: dict[str, Any]) -> list[Launch]:
    """(jit function, grid, positional arguments, keywords) of every launch `spec.run` makes."""
    import triton

    launches: list[Launch] = []

    def record(self: Any, grid: Any) -> Any:
        def launch(*args: Any, **kwargs: Any) -> None:
            size = grid(kwargs) if callable(grid) else grid
            launches.append((self, tuple(size), args, kwargs))
        return launch

    # A parameter this commit's spec does not know yet is left to its launcher's default: a
    # value the launcher cannot run shows as other device code, not as an error.
    known = set(spec.default(problem)) | set(spec.space(problem))
    config = {k: v for k, v in config.items() if k in known}
    original = triton.runtime.jit.JITFunction.__getitem__
    triton.runtime.jit.JITFunction.__getitem__ = record
    try:
        spec.run(_meta_inputs(spec, problem), spec.normalize(problem, config))
    finally:
        triton.runtime.jit.JITFunction.__getitem__ = original
    return launches


def _signature(fn: Any, args: tuple, kwargs: dict) -> tuple[dict, dict, dict]:
    """Triton's signature, constants and divisibility attributes for one recorded launch, as
    its launcher specialises them (integers equal to 1 as constants; pointers, and integers
    divisible by 16, marked so)."""
    import torch

    signature: dict[str, str] = {}
    constants: dict[str, Any] = {}
    attrs: dict[tuple[int, ...], list] = {}
    values = dict(zip(fn.arg_names, args, strict=False))
    values.update({k: v for k, v in kwargs.items() if k in fn.arg_names})
    for i, name in enumerate(fn.arg_names):
        value = values[name]
        if fn.params[i].is_constexpr:
            signature[name], constants[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + TYPES[str(value.dtype)]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            if value == 1:
                signature[name], constants[name] = "constexpr", 1
            else:
                signature[name] = "i32" if abs(value) < 2**31 else "i64"
                if value % 16 == 0:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}: argument {name} of type {type(value).__name__}")
    return signature, constants, attrs


def fingerprint(launches: list[Launch]) -> str:
    """SHA-256 over the grid and the SASS of every launch, in launch order."""
    from sass_mix import _cubin_tool, hopper_compile

    digest = hashlib.sha256()
    for fn, grid, args, kwargs in launches:
        signature, constants, attrs = _signature(fn, args, kwargs)
        options = {k: kwargs[k] for k in COMPILE_OPTIONS if k in kwargs}
        options.setdefault("num_stages", 1)
        sass = _cubin_tool("nvdisasm", hopper_compile(fn, signature, constants, attrs, options),
                           "-c")
        code = [line for line in sass.splitlines()
                if line.strip() and not line.lstrip().startswith(("//", ".section", ".global",
                                                                  ".type", ".size", ".align",
                                                                  ".headerflags", ".elftype"))]
        digest.update(f"{fn.__name__} {grid}\n".encode() + "\n".join(code).encode())
    return digest.hexdigest()


def main() -> None:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("device_code.py compiles for a GPU: unset TRITON_INTERPRET")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("suite")
    ap.add_argument("out")
    ap.add_argument("--src", default=str(Path(__file__).parents[1] / "src"))
    ap.add_argument("--part", default=None, help="only the rows of this part (file name)")
    ap.add_argument("--kernel", default=None, help="only the rows of this kernel")
    ap.add_argument("--table", default=str(Path(__file__).parents[1] / "src/kerneltune/tables"
                                           / "nvidia-h100-80gb-hbm3.json"),
                    help="the tuned table whose configs the rows ran (default: the H100's)")
    args = ap.parse_args()
    sys.path.insert(0, args.src)
    sys.path.insert(0, str(Path(__file__).parent))

    from kerneltune.kernels import REGISTRY
    from kerneltune.table import load as load_table
    from kerneltune.table import m_bucket

    table = load_table(Path(args.table)).index()
    _as_h100([m for name, m in sys.modules.items() if name.startswith("kerneltune.kernels")])
    result: dict[str, str] = {}
    for row in json.loads(Path(args.suite).read_text())["rows"]:
        if row["impl"] != "kerneltune" or row.get("gpu_us") is None:
            continue
        if args.part and row["source"] != args.part:
            continue
        if args.kernel and row["kernel"] != args.kernel:
            continue
        entry = table.get((row["kernel"], row["dtype"], row["n"], m_bucket(row["m"])))
        if entry is None:
            continue
        spec = REGISTRY[row["kernel"]]
        problem = spec.problem(row["m"], row["n"], row["dtype"], **row["options"])
        name = f"{row['kernel']} {row['m']}x{row['n']} {row['options']} {row['source']}"
        result[name] = fingerprint(recorded_launches(spec, problem, entry.config))
        print(name, result[name][:12], flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
