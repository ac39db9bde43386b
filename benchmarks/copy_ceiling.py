"""How fast a kernel's bytes alone move at a shape, set beside the fraction of copy bandwidth the
kernel is held to and, with `--table`, beside the kernel: what is left to the kernel's own work
there.

    PYTHONPATH=src python benchmarks/copy_ceiling.py OUT.json \
        --shapes rmsnorm_fwd:4096x5120,rmsnorm_quant_fwd:4096x1024 \
        [--outputs rotating|shared|both] [--table TABLE]

Each kernel's traffic is moved with no row to wait for: element i of each output is made from
element i of each input alone (`MOVES`: the forward reads x and writes y; quant reads x and
writes a byte; add + norm reads x and the residual and writes both; the backward reads x and dy
and writes dx). A Triton kernel streams it in tiles of BLOCK elements, one tile a program or
looped over on a persistent grid of `per_sm` programs an SM, launched the ordinary way or as a
programmatic dependent launch (as the kernels are on sm_90); torch's `copy_` of the same
tensors times beside them. Every candidate is timed as the tuner times a config (CUDA-graph
replay over rotating inputs that exceed the L2, median) and its output checked first. The bytes
counted are the kernel's own (`KernelSpec.bytes_moved`: the weight and quant's scales too),
held against the device's copy bandwidth, measured in the same run. The row's reduction, which
the kernel needs before it writes any of the row, is not here.

Where the outputs go matters at sizes the L2 holds. The tuner and the suite time a kernel as it
is called, its outputs allocated in each call of the captured graph: the graph's pool hands
each call the block the call before it freed, so every call writes the same memory, and an
output the L2 holds is overwritten there rather than written back. A mover's outputs rotate
with its inputs unless `--outputs shared` gives every set the first set's; `--table` times the
table's pick at each shape both ways (its outputs freed each call, and kept alive).

Without a GPU the movers run under the Triton interpreter (small shapes; the tests run it so):
each is checked and timed by the interpreter's wall clock, with no fraction of copy and no plot.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

from kerneltune.env import device_name, environment, on_gpu
from kerneltune.kernels import REGISTRY, Inputs, KernelConfig, KernelSpec
from kerneltune.kernels._dependent_launch import release_next_grid, wait_prior_grid
from kerneltune.kernels._spec import dependent_launch, sm_count
from kerneltune.table import Table
from kerneltune.table import load as load_table
from kerneltune.tuner.timing import (
    copy_bandwidth_gbps,
    graph_time,
    interpreter_time,
    rotating_inputs,
    rotation_count,
)
from sweep_configs import completed

#: Per kernel: how many same-shape inputs it reads, and the dtype of each output (None: the
#: input's dtype).
MOVES: dict[str, tuple[int, tuple[torch.dtype | None, ...]]] = {
    "rmsnorm_fwd": (1, (None,)),
    "rmsnorm_quant_fwd": (1, (torch.int8,)),
    "add_rmsnorm_fwd": (2, (None, None)),
    "rmsnorm_bwd": (2, (None,)),
}

#: The fraction of copy bandwidth each kernel is held to at M >= 4096 (the forward's at
#: M = 2048 is lower, `bar`).
BARS = {"rmsnorm_fwd": 0.90, "rmsnorm_quant_fwd": 0.85, "add_rmsnorm_fwd": 0.85,
        "rmsnorm_bwd": 0.75}


def bar(kernel: str, m: int) -> float | None:
    """The fraction of copy bandwidth `kernel` is held to at M = m (None: none)."""
    if kernel == "rmsnorm_fwd" and m == 2048:
        return 0.85
    return BARS[kernel] if m >= 4096 else None


@triton.jit
def _move_kernel(a_ptr, b_ptr, out_ptr, out2_ptr, numel,
                 TWO_IN: tl.constexpr, TWO_OUT: tl.constexpr, BLOCK: tl.constexpr,
                 PDL: tl.constexpr):
    """out[i] = a[i] (+ b[i]) and out2[i] = out[i], cast at the store; tiles pid, pid + P, ..."""
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    wait_prior_grid(PDL)
    for start in range(pid * BLOCK, numel, step):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < numel
        v = tl.load(a_ptr + offs, mask=mask).to(tl.float32)
        if TWO_IN:
            v += tl.load(b_ptr + offs, mask=mask).to(tl.float32)
        if start + step >= numel:  # this program's last tile: only stores are left
            release_next_grid(PDL)
        tl.store(out_ptr + offs, v.to(out_ptr.dtype.element_ty), mask=mask)
        if TWO_OUT:
            tl.store(out2_ptr + offs, v.to(out2_ptr.dtype.element_ty), mask=mask)


@dataclass(frozen=True)
class Mover:
    """One way of moving the bytes: BLOCK elements a tile, `per_sm` programs an SM looping over
    the tiles (0: one program a tile), with or without programmatic dependent launch."""

    block: int
    num_warps: int
    per_sm: int
    pdl: bool

    @property
    def name(self) -> str:
        grid = f"{self.per_sm}/SM" if self.per_sm else "a tile each"
        return f"triton {self.block}/{self.num_warps}w/{grid}{'/pdl' if self.pdl else ''}"

    def __call__(self, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        numel = inputs[0].numel()
        tiles = triton.cdiv(numel, self.block)
        grid = min(tiles, self.per_sm * sm_count(inputs[0].device)) if self.per_sm else tiles
        a, b = inputs[0], inputs[-1]
        _move_kernel[(grid,)](a, b, outputs[0], outputs[-1], numel,
                              TWO_IN=len(inputs) > 1, TWO_OUT=len(outputs) > 1,
                              BLOCK=self.block, PDL=self.pdl, num_warps=self.num_warps,
                              launch_pdl=self.pdl)


def torch_copy(inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
    """torch's own: the first output copied from the input (a cast where dtypes differ) or the
    sum of the two inputs; a second output copied from the first."""
    if len(inputs) > 1:
        torch.add(inputs[0], inputs[1], out=outputs[0])
    else:
        outputs[0].copy_(inputs[0])
    for out in outputs[1:]:
        out.copy_(outputs[0])


def movers(device: torch.device) -> list[Mover]:
    """The Triton candidates: tiles of 512-16K elements over 1-16 warps, 8 to 128 elements a
    thread (one to sixteen 16-byte vectors of 16-bit values), one program a tile or 1-4
    programs an SM; each with PDL where the device has it."""
    pdl = [False, True] if dependent_launch(device) else [False]
    return [Mover(block, warps, per_sm, p)
            for block in (512, 1024, 2048, 4096, 8192, 16384)
            for warps in (1, 2, 4, 8, 16) if 8 <= block // (32 * warps) <= 128
            for per_sm in (0, 1, 2, 4)
            for p in pdl]


def tensors(kernel: str, m: int, n: int, dtype: torch.dtype, device: torch.device
            ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """A set of inputs and outputs. The inputs hold small integers, so that sums and casts are
    exact and any mover's output is checked bit for bit."""
    reads, writes = MOVES[kernel]
    inputs = [torch.randint(-60, 60, (m, n), device=device).to(dtype) for _ in range(reads)]
    outputs = [torch.empty(m, n, dtype=w or dtype, device=device) for w in writes]
    return inputs, outputs


def expected(inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> list[torch.Tensor]:
    v = sum(t.float() for t in inputs)
    return [v.to(out.dtype) for out in outputs]


def check(move: Callable[[list[torch.Tensor], list[torch.Tensor]], None],
          inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
    """Raise unless `move` writes what the byte structure says, bit for bit."""
    for out in outputs:
        out.fill_(0)
    move(inputs, outputs)
    for got, want in zip(outputs, expected(inputs, outputs), strict=True):
        if not torch.equal(got, want):
            raise AssertionError(f"wrong output: {int((got != want).sum())} elements differ")


def rotation(kernel: str, m: int, n: int, dtype: torch.dtype, device: torch.device,
             n_sets: int, shared_outputs: bool
             ) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """`n_sets` sets of inputs, each with outputs of its own, or all writing the first set's
    outputs (`shared_outputs`): as a kernel's outputs fall when they are allocated in each call
    of a captured graph, which hands each call the block the call before it freed."""
    sets = [tensors(kernel, m, n, dtype, device) for _ in range(n_sets)]
    if shared_outputs:
        sets = [(inputs, sets[0][1]) for inputs, _ in sets]
    return sets


def timed(call: Callable[[int], Any], n_sets: int, nbytes: int, copy_gbps: float | None
          ) -> dict[str, float]:
    """GPU time of `call(i)` over the sets, as the tuner times a config, and its fraction of
    copy counting `nbytes`; without a GPU (no copy bandwidth), the interpreter's wall clock of
    a call alone."""
    if copy_gbps is None:
        return {"gpu_us": round(interpreter_time(lambda: call(0)).median_us, 3)}
    us = graph_time(call, n_sets, budget_ms=50.0, min_replays=20).median_us
    return {"gpu_us": round(us, 3), "frac_copy": round(nbytes / (us * 1e-6) / 1e9 / copy_gbps, 4)}


def set_count(nbytes: int, device: torch.device) -> int:
    """Input sets to rotate through: more than 4x the L2 on a GPU, one on the CPU."""
    return rotation_count(nbytes, device) if device.type == "cuda" else 1


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def ceiling(kernel: str, m: int, n: int, dtype: torch.dtype, copy_gbps: float | None,
            device: torch.device, shared_outputs: bool = False) -> dict[str, Any]:
    """Every candidate at one shape, timed; the fastest, its fraction of copy and the bar."""
    problem = REGISTRY[kernel].problem(m, n, dtype_name(dtype))
    nbytes = REGISTRY[kernel].bytes_moved(problem)
    sets = rotation(kernel, m, n, dtype, device, set_count(nbytes, device), shared_outputs)
    rows = []
    candidates: list[tuple[str, Callable[..., None]]] = [("torch copy_", torch_copy)]
    candidates += [(mv.name, mv) for mv in movers(device)]
    for name, move in candidates:
        check(move, *sets[0])
        rows.append({"impl": name, **timed(lambda i, move=move: move(*sets[i]), len(sets),
                                           nbytes, copy_gbps)})
    best = min(rows, key=lambda r: r["gpu_us"])
    return {"kernel": kernel, "m": m, "n": n, "dtype": dtype_name(dtype),
            "outputs": "shared" if shared_outputs else "rotating", "bytes": nbytes,
            "bar": bar(kernel, m), "best": best, "rows": rows}


def kernel_rows(kernel: str, m: int, n: int, dtype: torch.dtype, copy_gbps: float | None,
                device: torch.device, table: Table) -> list[dict[str, Any]]:
    """The table's pick for the shape, timed both ways (`both_ways`)."""
    spec = REGISTRY[kernel]
    options = {"quant": "int8"} if "quant" in spec.options else {}
    problem = spec.problem(m, n, dtype_name(dtype), **options)
    [config] = completed(spec, problem, [{}], table)
    sets = (rotating_inputs(spec, problem, device=str(device)) if device.type == "cuda"
            else [spec.make_inputs(problem, 0, device)])
    ways = both_ways(spec, sets, config, spec.bytes_moved(problem), copy_gbps)
    return [{"impl": f"kerneltune, outputs {label}", "config": config.to_json(), **ways[way]}
            for way, label in (("freed", "freed each call"), ("kept", "kept"))]


def both_ways(spec: KernelSpec, sets: list[Inputs], config: KernelConfig, nbytes: int,
              copy_gbps: float | None) -> dict[str, dict[str, float]]:
    """`config` timed as the tuner times it ("freed": its outputs allocated in each call of the
    graph, so each call writes where the one before it did) and with every call's outputs
    kept alive ("kept": each writing memory of its own, as a mover's rotating outputs)."""
    rows = {}
    for kept, label in ((None, "freed"), ([], "kept")):
        def call(i: int, kept: list | None = kept) -> None:
            out = spec.run(sets[i], config)
            if kept is not None:
                kept.append(out)

        rows[label] = timed(call, len(sets), nbytes, copy_gbps)
    return rows


def plot(data: dict[str, Any], path: Path) -> Path:
    """Per shape, bars of the fraction of copy: the fastest mover with rotating and with shared
    outputs, and the table's pick with its outputs freed each call and kept; a tick at the bar."""
    from kerneltune.report._figure import pyplot, save

    shapes: dict[tuple[str, int, int], dict[str, float]] = {}
    bars: dict[tuple[str, int, int], float | None] = {}
    for r in data["shapes"]:
        key = (r["kernel"], r["m"], r["n"])
        got = shapes.setdefault(key, {})
        if "best" in r:
            got[f"fastest mover, {r.get('outputs', 'rotating')} outputs"] = r["best"]["frac_copy"]
            bars[key] = r["bar"]
        else:
            got.update({row["impl"]: row["frac_copy"] for row in r["rows"]})
    labels = sorted({label for got in shapes.values() for label in got})
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(2.2 + 1.6 * len(shapes), 4.2))
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        xs = [j + i * width for j, got in enumerate(shapes.values()) if label in got]
        ax.bar(xs, [got[label] for got in shapes.values() if label in got], width, label=label)
    for j, key in enumerate(shapes):
        if bars.get(key):
            ax.hlines(bars[key], j - width / 2, j + 0.8 - width / 2, colors="black")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shapes))],
                  [f"{k.removesuffix('_fwd')}\n{m} x {n}" for k, m, n in shapes])
    ax.set_ylabel("fraction of copy bandwidth (black: the bar)")
    ax.set_ylim(0, 1.4)
    ax.legend(fontsize=7, loc="upper center", ncol=2)
    return save(fig, f"{data['device']}: moving a kernel's bytes, and the kernel", path)


def parse_shapes(text: str) -> list[tuple[str, int, int]]:
    """KERNEL:MxN,... as (kernel, m, n); an unknown kernel is an error naming the known ones."""
    shapes = []
    for item in text.split(","):
        kernel, _, shape = item.partition(":")
        if kernel not in MOVES:
            raise ValueError(f"{kernel!r}: one of {', '.join(MOVES)}")
        m, _, n = shape.partition("x")
        if not (m.isdigit() and n.isdigit()):
            raise ValueError(f"{item!r}: KERNEL:MxN, e.g. rmsnorm_fwd:4096x1024")
        shapes.append((kernel, int(m), int(n)))
    return shapes


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="JSON to write (and a PNG beside it)")
    ap.add_argument("--replot", action="store_true", help="only draw OUT's PNG from OUT")
    ap.add_argument("--shapes", help="KERNEL:MxN,... (required unless --replot)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--outputs", default="rotating", choices=["rotating", "shared", "both"],
                    help="each input set's outputs its own, one set of outputs for all (as a "
                         "kernel that allocates them in a captured graph gets), or both")
    ap.add_argument("--table", type=Path, default=None,
                    help="also time this tuned table's pick at each shape, its outputs freed "
                         "each call and kept")
    args = ap.parse_args(argv)
    if args.replot:
        plot(json.loads(args.out.read_text()), args.out.with_suffix(".png"))
        return
    if not args.shapes:
        ap.error("--shapes is required")
    shapes = parse_shapes(args.shapes)
    device = torch.device("cuda" if on_gpu() else "cpu")
    copy = copy_bandwidth_gbps(device.type)
    print(f"{device_name()}: copy {f'{copy:.0f} GB/s' if copy else 'not measured'}", flush=True)
    data: dict[str, Any] = {}
    results = []
    for kernel, m, n in shapes:
        for shared in {"rotating": [False], "shared": [True], "both": [False, True]}[args.outputs]:
            r = ceiling(kernel, m, n, getattr(torch, args.dtype), copy, device, shared)
            results.append(r)
            b = r["best"]
            print(f"{kernel} {m}x{n}, {r['outputs']} outputs: best {b['impl']} "
                  f"{b['gpu_us']:.2f} µs = {b.get('frac_copy', math.nan):.3f} of copy "
                  f"(bar {r['bar']})", flush=True)
        if args.table is not None:
            rows = kernel_rows(kernel, m, n, getattr(torch, args.dtype), copy, device,
                               load_table(args.table))
            results.append({"kernel": kernel, "m": m, "n": n, "rows": rows})
            for row in rows:
                print(f"  {row['impl']}: {row['gpu_us']:.2f} µs = "
                      f"{row.get('frac_copy', math.nan):.3f} of copy", flush=True)
        data = {"device": device_name(), "env": environment().__dict__,
                "date": time.strftime("%Y-%m-%d"), "copy_gbps": round(copy, 1) if copy else None,
                "shapes": results}
        args.out.write_text(json.dumps(data, indent=1))
    if copy:  # the plot is of fractions of copy bandwidth
        plot(data, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
