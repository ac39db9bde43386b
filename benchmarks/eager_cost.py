"""Eager cost of kerneltune's public functions beside `F.rms_norm`, in one process.

What a user without CUDA graphs pays per call: back-to-back calls from Python, host overhead
included (`kerneltune.runtime.bench.per_call_us`: best of 5 x N calls, synchronised). Each
function runs beside torch's own op at the same shape, so a row's ratio holds whatever the
host's speed (LayerNorm's are also beside `F.layer_norm`, in their own rows); the training
step is a forward and an autograd backward. Only public functions are called (those a commit
has), so the same script measures any commit (``PYTHONPATH=<its src>``), which is how a change
to the launch path is checked against the code before it.

    PYTHONPATH=src python benchmarks/eager_cost.py --out eager.json [--label after]

`--entries M` also measures every config the runtime can pick at up to M rows: each entry of
the file table it reads first (KERNELTUNE_TABLE's, else the machine's own, else the one shipped
for this GPU) whose bucket is at most M, called at its own key through the public function
that runs it (the training step for a backward entry), each row saying what the runtime
resolved there (`kerneltune.explain`); the result ends with the largest ratio per function.
The file is rewritten after the functions' rows and after each entry's (`complete` false until
the last), so a run stopped by a time limit keeps what it measured.

    PYTHONPATH=src python benchmarks/eager_cost.py --out eager.json --entries 64
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import kerneltune
from kerneltune.env import device_name, environment
from kerneltune.runtime.bench import per_call_us
from result_files import write_json

#: (M, N) of the inference calls: one token, a small batch, and row counts whose configs split
#: each row over several programs.
SHAPES = ((1, 4096), (64, 4096), (64, 8192), (16, 65536), (3000, 12288))
#: (M, N) of the training step.
TRAIN_SHAPES = ((64, 4096), (4096, 2880))


def inference_calls(x: torch.Tensor, w: torch.Tensor) -> dict[str, Callable[[], Any]]:
    n, residual, b = x.shape[-1], torch.randn_like(x), torch.randn_like(w)
    group = math.gcd(n, 128)  # groups of 128 columns, as the tuner times them where they fit
    calls = {
        "F.rms_norm": lambda: F.rms_norm(x, (n,), w, 1e-6),
        "rms_norm": lambda: kerneltune.rms_norm(x, w),
        "add_rms_norm": lambda: kerneltune.add_rms_norm(x, residual, w),
        "rms_norm_quant int8": lambda: kerneltune.rms_norm_quant(x, w, quant="int8"),
        "rms_norm_quant fp8": lambda: kerneltune.rms_norm_quant(x, w, quant="fp8"),
    }
    if hasattr(kerneltune, "layer_norm"):  # not in commits before LayerNorm and group quant
        calls |= {
            "F.layer_norm": lambda: F.layer_norm(x, (n,), w, b),
            "layer_norm": lambda: kerneltune.layer_norm(x, w, b),
            "rms_norm_group_quant fp8": lambda: kerneltune.rms_norm_group_quant(
                x, w, group_size=group),
            "add_rms_norm_quant fp8": lambda: kerneltune.add_rms_norm_quant(
                x, residual, w, group_size=group),
        }
    return calls


def training_calls(x: torch.Tensor, w: torch.Tensor) -> dict[str, Callable[[], Any]]:
    n, dy = x.shape[-1], torch.randn_like(x)
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    b = torch.randn_like(w).requires_grad_()
    calls = {
        "F.rms_norm": lambda: F.rms_norm(x, (n,), w, 1e-6).backward(dy),
        "rms_norm": lambda: kerneltune.rms_norm(x, w).backward(dy),
    }
    if hasattr(kerneltune, "layer_norm"):
        calls |= {
            "F.layer_norm": lambda: F.layer_norm(x, (n,), w, b).backward(dy),
            "layer_norm": lambda: kerneltune.layer_norm(x, w, b).backward(dy),
        }
    return calls


def measure(device: str, dtype: torch.dtype, calls: int, shapes: tuple = SHAPES,
            train_shapes: tuple = TRAIN_SHAPES) -> list[dict[str, Any]]:
    rows = []
    for mode, cases in (("inference", shapes), ("training", train_shapes)):
        for m, n in cases:
            x = torch.randn(m, n, device=device, dtype=dtype)
            w = torch.randn(n, device=device, dtype=dtype)
            fns = inference_calls(x, w) if mode == "inference" else training_calls(x, w)
            with torch.inference_mode(mode == "inference"):
                timed = {name: per_call_us(fn, calls=calls) for name, fn in fns.items()}
            base = timed["F.rms_norm"]
            rows += [{"mode": mode, "fn": name, "m": m, "n": n, "eager_us": round(us, 2),
                      "ratio_to_F.rms_norm": round(us / base, 3)} for name, us in timed.items()]
            for r in rows[-len(timed):]:
                print(json.dumps(r), flush=True)
    return rows


#: The functions that run each kernel's entries, as `inference_calls` and `training_calls`
#: name them, and the mode they are called in.
ENTRY_CALLS = {
    "rmsnorm_fwd": ("inference", ("rms_norm",)),
    "add_rmsnorm_fwd": ("inference", ("add_rms_norm",)),
    "rmsnorm_quant_fwd": ("inference", ("rms_norm_quant int8", "rms_norm_quant fp8")),
    "rmsnorm_bwd": ("training", ("rms_norm",)),
    "layernorm_fwd": ("inference", ("layer_norm",)),
    "layernorm_bwd": ("training", ("layer_norm",)),
    "rmsnorm_group_quant_fwd": ("inference", ("rms_norm_group_quant fp8",)),
    "add_rmsnorm_group_quant_fwd": ("inference", ("add_rms_norm_quant fp8",)),
}


def runtime_table(device: str) -> Any:
    """The file table the runtime reads first here: KERNELTUNE_TABLE's, else the machine's own
    (`kerneltune tables`), else the one shipped for `device`. (Imported here: the rest of the
    script calls public functions only, and so runs against older commits too.)"""
    from kerneltune.runtime.sources import env_table, local_table, shipped_table

    for read in (env_table, local_table, shipped_table):
        loaded = read(device)
        if loaded is not None:
            return loaded.table
    return None


def measure_entries(table: Any, max_m: int, device: str, calls: int
                    ) -> Iterator[dict[str, Any]]:
    """Every entry of `table` of the kernels of `ENTRY_CALLS` with a bucket of at most `max_m`
    rows, timed at its key through its functions beside F.rms_norm's same call, with what the
    runtime resolved there: a row each, as it is measured."""
    for e in sorted(table.entries, key=lambda e: (e.kernel, e.dtype, e.n, e.m)):
        if e.kernel not in ENTRY_CALLS or e.m > max_m:
            continue
        mode, names = ENTRY_CALLS[e.kernel]
        dtype = getattr(torch, e.dtype)
        x = torch.randn(e.m, e.n, device=device, dtype=dtype)
        w = torch.randn(e.n, device=device, dtype=dtype)
        fns = inference_calls(x, w) if mode == "inference" else training_calls(x, w)
        found = kerneltune.explain(e.kernel, x)
        with torch.inference_mode(mode == "inference"):
            timed = {name: per_call_us(fns[name], calls=calls)
                     for name in ("F.rms_norm", *names)}
        for name in names:
            yield {
                "mode": mode, "fn": name, "kernel": e.kernel, "m": e.m, "n": e.n,
                "dtype": e.dtype, "config": dict(e.config), "match": found.match,
                "source": found.source, "runs_entry": dict(found.config) == dict(e.config),
                "eager_us": round(timed[name], 2),
                "ratio_to_F.rms_norm": round(timed[name] / timed["F.rms_norm"], 3)}


def worst_ratios(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per function (and mode), the entry row with the largest ratio to F.rms_norm."""
    worst: dict[str, dict[str, Any]] = {}
    for r in rows:
        key = f"{r['mode']} {r['fn']}"
        if key not in worst or r["ratio_to_F.rms_norm"] > worst[key]["ratio_to_F.rms_norm"]:
            worst[key] = r
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="", help="what this run measures (e.g. a commit)")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--entries", type=int, default=None, metavar="M",
                    help="also every entry of the runtime's table with a bucket of at most M "
                         "rows, at its own key")
    args = ap.parse_args()
    table = None
    if args.entries is not None:  # looked up first: a run without one measures nothing
        table = runtime_table(device_name())
        if table is None:
            raise SystemExit(f"no tuned table for {device_name()}: set KERNELTUNE_TABLE")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    small = device == "cpu"  # under the interpreter: the path, not the time
    rows = measure(device, getattr(torch, args.dtype), args.calls,
                   ((2, 64),) if small else SHAPES, ((2, 64),) if small else TRAIN_SHAPES)
    result = {"label": args.label, "device": device_name(), "env": environment().__dict__,
              "source": str(Path(kerneltune.__file__).parent), "dtype": args.dtype,
              "method": f"best of 5 x {args.calls} back-to-back calls, synchronised",
              "rows": rows}
    write_json(args.out, result)  # kept should the entries' run be stopped
    if table is not None:
        entries: dict[str, Any] = {"max_m": args.entries, "complete": False, "rows": []}
        result["entries"] = entries
        for row in measure_entries(table, args.entries, device, args.calls):
            entries["rows"].append(row)
            write_json(args.out, result)
            print(json.dumps(row), flush=True)  # once it is in the file
        entries["worst"] = worst_ratios(entries["rows"])
        entries["complete"] = True
        for key, r in entries["worst"].items():
            print(f"# {key}: at most {r['ratio_to_F.rms_norm']:.2f}x F.rms_norm "
                  f"({r['kernel']} {r['m']} x {r['n']}, {r['config']})", flush=True)
        write_json(args.out, result)


if __name__ == "__main__":
    main()
