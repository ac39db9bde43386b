"""Fingerprints of the device code each tuned config launches, compiled for sm_90 without a GPU.

A refactor of the host side (configs, launchers, the runtime's launch path) must not change what
the GPU runs, or every tuned entry would stand for code that no longer exists. This runs each
table entry's launch with every ``kernel[grid](...)`` recorded instead of launched (as an H100 or
H200 would launch it: 132 SMs, programmatic dependent launch), compiles each recorded launch with
Triton's CUDA backend for sm_90, and hashes its grid and SASS (Triton's bundled ``nvdisasm``,
comments and section headers dropped). Equal fingerprints: the same grids, and the same
instructions in the same order, for every kernel of the call.

    PYTHONPATH=src python benchmarks/device_code.py OUT.json [--src DIR] [--table T ...]
    python benchmarks/device_code.py --compare BEFORE.json AFTER.json

The first form fingerprints every entry of the tables (default: those shipped under DIR, this
checkout's ``src`` unless given; ``git archive REV src | tar -x -C DIR`` gives another commit's);
the second exits 1, naming them, if any entry's fingerprint differs.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: What the launchers are told about the device: 132 SMs (H100 SXM and H200), dependent launch.
SMS = 132
TYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32",
         "torch.int8": "i8", "torch.float8_e4m3fn": "fp8e4nv", "torch.int32": "i32",
         "torch.int64": "i64", "torch.uint8": "u8"}
#: Launch options that change what is compiled.
COMPILE_OPTIONS = ("num_warps", "num_stages", "maxnreg")
#: SASS lines that name rather than are instructions.
NOT_CODE = ("//", ".section", ".global", ".type", ".size", ".align", ".headerflags", ".elftype")

Launch = tuple[Any, tuple[int, ...], tuple, dict]


def as_hopper(modules: list[Any]) -> None:
    """Every loaded kernel module sees a compiled Hopper GPU: not the interpreter, 132 SMs,
    dependent launches."""
    for module in modules:
        for name, value in (("interpreting", lambda: False), ("sm_count", lambda device: SMS),
                            ("dependent_launch", lambda device: True)):
            if hasattr(module, name):
                setattr(module, name, value)


def meta_inputs(spec: Any, problem: Any) -> dict[str, Any]:
    """The problem's inputs as tensors without storage (their shapes, strides and dtypes are all
    a launch records): made for 3 rows and for 4, then each dimension that differs between the
    two given the problem's M."""
    import torch

    three, four = (spec.make_inputs(dataclasses.replace(problem, m=m), 0, "cpu") for m in (3, 4))
    return {k: torch.empty(tuple(problem.m if a != b else a
                                 for a, b in zip(v.shape, four[k].shape, strict=True)),
                           dtype=v.dtype, device="meta") if isinstance(v, torch.Tensor) else v
            for k, v in three.items()}


def recorded_launches(spec: Any, problem: Any, config: Any) -> list[Launch]:
    """(jit function, grid, positional arguments, keywords) of every launch `spec.run` makes."""
    import triton

    launches: list[Launch] = []

    def record(self: Any, grid: Any) -> Any:
        def launch(*args: Any, **kwargs: Any) -> None:
            size = grid(kwargs) if callable(grid) else grid
            launches.append((self, tuple(size), args, kwargs))
        return launch

    original = triton.runtime.jit.JITFunction.__getitem__
    triton.runtime.jit.JITFunction.__getitem__ = record
    try:
        spec.run(meta_inputs(spec, problem), config)
    finally:
        triton.runtime.jit.JITFunction.__getitem__ = original
    return launches


def signature_of(fn: Any, args: tuple, kwargs: dict) -> tuple[dict, dict, dict]:
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


def sass(fn: Any, signature: dict, constants: dict, attrs: dict, options: dict) -> str:
    """The SASS of a Triton kernel compiled for sm_90 with Triton's CUDA backend (no GPU
    needed), instructions only."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cubin = triton.compile(ASTSource(fn, signature, constants, attrs),
                           target=GPUTarget("cuda", 90, 32), options=options).asm["cubin"]
    tool = Path(triton.__file__).parent / "backends/nvidia/bin/nvdisasm"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        text = subprocess.run([str(tool), "-c", fh.name], capture_output=True, text=True,
                              check=True).stdout
    return "\n".join(line for line in text.splitlines()
                     if line.strip() and not line.lstrip().startswith(NOT_CODE))


class Fingerprinter:
    """Fingerprints of launches, each distinct compilation done once."""

    def __init__(self) -> None:
        self.compiled: dict[str, str] = {}

    def __call__(self, launches: list[Launch]) -> str:
        digest = hashlib.sha256()
        for fn, grid, args, kwargs in launches:
            signature, constants, attrs = signature_of(fn, args, kwargs)
            options = {k: kwargs[k] for k in COMPILE_OPTIONS if k in kwargs}
            options.setdefault("num_stages", 1)
            key = repr((fn.__module__, fn.__name__, signature, sorted(constants.items()),
                        sorted(attrs.items()), sorted(options.items())))
            code = self.compiled.get(key)
            if code is None:
                code = hashlib.sha256(sass(fn, signature, constants, attrs, options).encode())
                code = self.compiled[key] = code.hexdigest()
            digest.update(f"{fn.__name__} {grid} {code}\n".encode())
        return digest.hexdigest()


def config_of(spec: Any, problem: Any, data: dict[str, Any]) -> Any:
    """An entry's config as the code under test reads it (`parse`; before typed configs,
    `normalize`)."""
    parse = getattr(spec, "parse", None)
    return parse(problem, data) if parse else spec.normalize(problem, data)


def table_fingerprints(path: Path, kernel: str | None = None) -> dict[str, str]:
    """Entry key -> fingerprint of the launches of every problem the entry serves."""
    from kerneltune.kernels import REGISTRY
    from kerneltune.table import load

    fingerprint = Fingerprinter()
    entries = [e for e in load(path).entries if kernel in (None, e.kernel)]
    result: dict[str, str] = {}
    start = time.monotonic()
    for i, e in enumerate(entries, 1):
        spec = REGISTRY[e.kernel]
        key = f"{e.kernel} {e.dtype} n={e.n} m={e.m}"
        parts = []
        for problem in spec.served(spec.problem(e.m, e.n, e.dtype)):
            config = config_of(spec, problem, e.config)
            parts.append(fingerprint(recorded_launches(spec, problem, config)))
        result[key] = hashlib.sha256(" ".join(parts).encode()).hexdigest()[:32]
        if i % 50 == 0 or i == len(entries):
            print(f"{path.name}: {i}/{len(entries)} entries, {len(fingerprint.compiled)} "
                  f"compilations, {time.monotonic() - start:.0f} s", flush=True)
    return result


def compare(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The entries whose fingerprints differ, or that only one side has."""
    differ = []
    for table in sorted(set(before["tables"]) | set(after["tables"])):
        a, b = before["tables"].get(table, {}), after["tables"].get(table, {})
        differ += [f"{table}: {key}" for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]
    return differ


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", help="where to write the fingerprints (JSON)")
    ap.add_argument("--src", default=str(Path(__file__).parents[1] / "src"))
    ap.add_argument("--table", action="append", default=[],
                    help="a table to fingerprint (repeatable; default: the shipped ones)")
    ap.add_argument("--kernel", default=None, help="only this kernel's entries")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args()
    if args.compare:
        before, after = (json.loads(Path(p).read_text()) for p in args.compare)
        differ = compare(before, after)
        for line in differ:
            print("differs:", line)
        total = sum(len(t) for t in after["tables"].values())
        print(f"{total - len(differ)} of {total} entries identical")
        raise SystemExit(1 if differ else 0)
    if not args.out:
        ap.error("give OUT.json, or --compare BEFORE AFTER")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("device_code.py compiles for a GPU: unset TRITON_INTERPRET")
    sys.path.insert(0, args.src)
    import triton

    import kerneltune.kernels

    if not Path(kerneltune.kernels.__file__).resolve().is_relative_to(Path(args.src).resolve()):
        raise SystemExit(f"kerneltune was imported from {kerneltune.kernels.__file__}, "
                         f"not from {args.src}")
    as_hopper([m for name, m in sys.modules.items() if name.startswith("kerneltune.kernels")])
    tables = [Path(t) for t in args.table] or sorted(
        (Path(args.src) / "kerneltune/tables").glob("*.json"))
    result = {"triton": triton.__version__, "target": "sm_90", "sms": SMS,
              "kernel_hashes": {k: s.kernel_hash for k, s in kerneltune.kernels.REGISTRY.items()},
              "tables": {t.stem: table_fingerprints(t, args.kernel) for t in tables}}
    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
