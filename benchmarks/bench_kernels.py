"""Side-by-side GPU benchmark of kerneltune's kernels against their peers, in one process.

For every kernel and shape: kerneltune with the config the runtime takes from a tuned table (the
entry at the shape's key, else the nearest tuned shape's; each row says which) and with its
default config, and the peers of `peers.py`. Every implementation's output is checked against
the float64 reference before it is timed. Two numbers each: GPU time (CUDA-graph replay over
rotating inputs that together exceed 4x the L2, median) and eager time per call (back-to-back
calls, host overhead included). The device's copy bandwidth is measured in the same run, and at
each shape a copy of the kernel's bytes, timed alike: the ceiling at that size.

    PYTHONPATH=src python benchmarks/bench_kernels.py --kernels rmsnorm_fwd,rmsnorm_bwd,\
        add_rmsnorm_fwd,rmsnorm_quant_fwd --out suite.json [--shard I/K] [--resume]

LayerNorm and RMSNorm + per-group quant (`--kernels layernorm_fwd,layernorm_bwd,
rmsnorm_group_quant_fwd,add_rmsnorm_group_quant_fwd`) are measured alike; the group-quant
kernels at each of `--group-quant` x `--group-size` (fp8 in groups of 128 by default), at the
N its group size divides.

Without a GPU the same run goes through the Triton interpreter on the CPU (small shapes): its
result is filed under the interpreter's device name, its times are the interpreter's wall clock,
and it has no copy bandwidth. That is how the tests run it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Any, NamedTuple

import torch

sys.path.insert(0, str(Path(__file__).parent))

from kerneltune import table as tbl
from kerneltune.env import device_name, environment, on_gpu
from kerneltune.kernels import REGISTRY, KernelSpec, Problem
from kerneltune.kernels._spec import row_blocks, rows_of
from kerneltune.report import bench_markdown
from kerneltune.resolution import Source, resolve
from kerneltune.runtime.bench import per_call_us
from kerneltune.tuner.timing import (
    capture_graph,
    clone_inputs,
    copy_bandwidth_gbps,
    copy_time_us,
    interpreter_time,
    replay_time,
    rotating_inputs,
)
from peers import PEERS, Call, peer_versions
from result_files import write_json

SUITE_M = [1, 16, 256, 2048, 4096, 16384]
SUITE_N = [1024, 2048, 3584, 4096, 5120, 7168, 8192, 14336, 16384, 32768, 65536, 131072, 262144]
MAX_TENSOR_BYTES = 8 << 30
#: Relative L2 error a peer may have against the float64 reference (peers round differently).
PEER_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 1.5e-2,
            torch.int8: 2e-2, torch.float8_e4m3fn: 6e-2}
#: The per-group quant's modes measured by default: DeepSeek's and vLLM's fp8 in groups of 128.
GROUP_QUANT = ["fp8"]
GROUP_SIZES = [128]


def _as_tuple(out: Any) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, tuple | list) else (out,)


class _L2Error:
    """One output's relative L2 error against its reference, added up a block at a time."""

    def __init__(self) -> None:
        self.diff2 = self.ref2 = 0.0
        self.finite = True

    def add(self, out: torch.Tensor, ref: torch.Tensor) -> None:
        o64, e64 = out.detach().double(), ref.detach().double().reshape(out.shape)
        self.finite = self.finite and bool(torch.isfinite(o64).all())
        self.diff2 += float(torch.linalg.vector_norm(o64 - e64)) ** 2
        self.ref2 += float(torch.linalg.vector_norm(e64)) ** 2

    def why(self, k: int, tol: float) -> str | None:
        if not self.finite:
            return f"output {k} has non-finite values"
        rel = (self.diff2 / max(self.ref2, 1e-60)) ** 0.5
        return f"output {k}: relative error {rel:.2e}" if rel > tol else None


def _peer_tolerance(out: torch.Tensor, dtype: torch.dtype) -> float:
    """A peer's output's relative L2 error bound: its dtype's, or the problem's `dtype`'s where
    that is looser (a quant scale is fp32 but comes from a row of `dtype` values, which a peer
    may or may not round as the reference does)."""
    return max(PEER_TOL.get(out.dtype, 1e-2), PEER_TOL[dtype])


def peer_error(outputs: Any, expected: Any, dtype: torch.dtype) -> str | None:
    """Loose check for peers: each output they return within a relative L2 error of its dtype,
    or of the problem's `dtype` where that is looser (`_peer_tolerance`)."""
    for k, (o, e) in enumerate(zip(_as_tuple(outputs), _as_tuple(expected), strict=False)):
        error = _L2Error()
        error.add(o, e)
        if why := error.why(k, _peer_tolerance(o, dtype)):
            return why
    return None


def peer_error_by_rows(spec: KernelSpec, inputs: dict[str, Any], outputs: Any,
                       dtype: torch.dtype) -> str | None:
    """`peer_error` against the spec's reference taken `row_blocks` at a time (whole where the
    spec has no `row_inputs`): whole, its float64 outputs alone take 32 GiB at 16384 x 262144,
    which ran every peer there out of memory even on a 141 GB H200. The errors are summed over
    the blocks, and a summed output (the backward's dw) compared once its blocks are added up,
    so the result is the whole check's."""
    outs = _as_tuple(outputs)
    if not spec.row_inputs:
        return peer_error(outs, spec.reference(inputs), dtype)
    m, *row = inputs[spec.row_inputs[0]].shape
    errors = [_L2Error() for _ in outs]
    sums: dict[int, torch.Tensor] = {}
    for rows in row_blocks(m, math.prod(row)):
        expected = _as_tuple(spec.reference(rows_of(inputs, spec.row_inputs, rows)))
        n_rows = len(range(m)[rows])
        for k, (o, e) in enumerate(zip(outs, expected, strict=False)):
            if k in spec.summed_outputs:
                sums[k] = e.double() + sums[k] if k in sums else e.double()
            else:  # any shape with M rows: (M, N), (M,), (M, 1)
                errors[k].add(o.reshape(m, -1)[rows], e.reshape(n_rows, -1))
    for k, total in sums.items():
        errors[k].add(outs[k], total)
    for k, (o, error) in enumerate(zip(outs, errors, strict=False)):
        if why := error.why(k, _peer_tolerance(o, dtype)):
            return why
    return None


def tuned_table(path: str | None, device: str) -> Source | None:
    """The table whose picks kerneltune runs (default: the one shipped for `device`), as the
    runtime's rule looks in it; None where there is none for this device."""
    p = Path(path) if path else tbl.shipped_table_path(device)
    if not p.exists():
        return None
    table = tbl.load(p)
    if table.device != device:
        print(f"note: table {p} is for {table.device}, not {device}; ignoring it")
        return None
    return Source("table", str(p), table)


class Impl(NamedTuple):
    """One implementation of a shape: its name, prepare() -> bind, whether it is kerneltune's
    (checked by the spec, else as a peer), and what its row says besides."""

    name: str
    prepare: Any
    ours: bool
    tags: dict[str, Any]


def implementations(spec: KernelSpec, problem: Problem, tuned: Source | None,
                    peers: bool | set[str]) -> list[Impl]:
    """Every implementation of this shape: kerneltune with the config the runtime's rule takes
    from the table (`kerneltune.resolution`: the entry at this key, else the nearest tuned
    shape's; its tags say which), with its default, and the kernel's peers (all of them, none,
    or those named)."""
    out: list[Impl] = []
    found = resolve(spec, problem.m, problem.n, problem.dtype, kernel_hash=spec.kernel_hash,
                    tables=[tuned] if tuned else [], options=tuple(problem.options))
    if found.entry is not None:
        tags: dict[str, Any] = {"match": found.match}
        if found.match != "exact":
            tags["tuned_at"] = {"n": found.entry.n, "m": found.entry.m}
        out.append(Impl("kerneltune", lambda c=found.config: lambda i: lambda: spec.run(i, c),
                        True, tags))
    for broken in found.passed_over:  # the runtime passes these over too
        print(f"note: {problem.m} x {problem.n}: passed over {broken}")
    default = spec.default(problem)
    out.append(Impl("kerneltune-default", lambda: lambda i: lambda: spec.run(i, default),
                    True, {}))
    if peers:
        out += [Impl(p.name, p.prepare, False, {}) for p in PEERS.get(spec.name, list)()
                if peers is True or p.name in peers]
    return out


def input_sets(spec: KernelSpec, problem: Problem, device: str, seed: int) -> list[dict]:
    """On a GPU, inputs that rotate through more than 4x the L2; on the CPU, one set."""
    if device == "cuda":
        return rotating_inputs(spec, problem, device=device, seed=seed)
    return [spec.make_inputs(problem, seed, device)]


def measure(spec: KernelSpec, problem: Problem, name: str, prepare: Any, ours: bool,
            sets: list[dict], copy_gbps: float | None, same_bytes_copy_us: float | None,
            device: str = "cuda", tags: dict[str, Any] | None = None) -> dict[str, Any]:
    """One implementation at one shape: its output checked, then timed (GPU time by graph
    replay and eager time per call on a GPU; the interpreter's wall clock on the CPU); `tags`
    go into its row as they are."""
    row: dict[str, Any] = {"kernel": spec.name, "m": problem.m, "n": problem.n,
                           "dtype": problem.dtype, "options": dict(problem.options), "impl": name,
                           **(tags or {})}
    gpu = device == "cuda"
    t0 = time.perf_counter()
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    try:
        bind = prepare()
        calls: list[Call] = [bind(s) for s in sets]
        # Captured before the float64 check, replayed after it passed (why: `capture_config`).
        graph = capture_graph(lambda j: calls[j](), len(calls)) if gpu else None
        check_inputs = clone_inputs(sets[0])
        out = bind(check_inputs)()
        if ours:  # the spec's check takes its reference a block of rows at a time
            why = spec.check(check_inputs, _as_tuple(out))
        else:
            # sets[0] as the peer found it (the check ran on a copy of it, which an in-place
            # peer may have changed)
            why = peer_error_by_rows(spec, sets[0], out, getattr(torch, problem.dtype))
        del out
        row["setup_s"] = round(time.perf_counter() - t0, 3)
        if why:
            row["error"] = f"wrong output: {why}"
            return row
        timing = replay_time(graph, len(calls)) if graph is not None else interpreter_time(
            calls[0])
        del graph
        gpu_s = timing.median_us * 1e-6
        row["gpu_us"] = round(timing.median_us, 3)
        row["gpu_spread"] = round(timing.spread, 4)
        row["gbps"] = round(spec.bytes_moved(problem) / gpu_s / 1e9, 1)
        if copy_gbps:
            row["frac_copy"] = round(row["gbps"] / copy_gbps, 4)
        if same_bytes_copy_us:
            row["frac_copy_same_bytes"] = round(same_bytes_copy_us / timing.median_us, 4)
        if gpu:
            n_calls = int(min(2000, max(20, 0.2 / max(gpu_s, 1e-6))))
            row["eager_us"] = round(per_call_us(calls[0], calls=n_calls, repeats=3), 3)
    except torch.cuda.OutOfMemoryError:
        row["error"] = "out of memory"
    except Exception as e:  # a peer that cannot run a shape is reported, not fatal
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        traceback.print_exc(limit=2)
    finally:
        if gpu:
            torch.cuda.synchronize()
            # the inputs' sets included: what a GPU must hold to measure this one
            row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
            torch.cuda.empty_cache()
    return row


def shape_key(kernel: str, options: dict[str, Any], m: int, n: int) -> tuple:
    return kernel, json.dumps(options, sort_keys=True), m, n


def earlier_result(path: Path, device: str) -> dict[str, Any]:
    """An earlier result at `path` (empty if there is no file), which must have been measured on
    `device`."""
    if not path.exists():
        return {}
    before = json.loads(path.read_text())
    if before["device"] != device:
        raise SystemExit(f"{path} was measured on {before['device']}, not {device}")
    return before


def done_shapes(rows: list[dict[str, Any]]) -> set[tuple]:
    """Shapes a result already holds: those with a kerneltune row (written after the shape's
    last implementation was measured, since the file is rewritten per shape)."""
    return {shape_key(r["kernel"], r["options"], r["m"], r["n"]) for r in rows
            if r["impl"].startswith("kerneltune")}


Shape = tuple[str, dict[str, Any], int, int]  # kernel, options, M, N


def group_modes(quants: list[str], sizes: list[int], ue8m0: list[bool] | None = None,
                column_major: list[bool] | None = None) -> list[dict[str, Any]]:
    """The per-group quant's options to measure: every quant mode at every group size (0: one
    group a row), and UE8M0 or column-major scales where their lists are given. An option
    left at its default is not named, so a result's labels ('...-128-fp8') stay short."""
    modes = []
    for quant in quants:
        for size in sizes:
            for scale_ue8m0 in ue8m0 or [False]:
                for cm in column_major or [False]:
                    opts: dict[str, Any] = {"quant": quant, "group_size": size}
                    if ue8m0:
                        opts["scale_ue8m0"] = scale_ue8m0
                    if column_major:
                        opts["column_major_scales"] = cm
                    modes.append(opts)
    return modes


def suite_shapes(kernels: list[str], quants: list[str], ms: list[int], ns: list[int],
                 dtype: str, groups: list[dict[str, Any]] | None = None) -> list[Shape]:
    """Every (kernel, options, M, N) to measure, in the order measured: per kernel and mode
    (`quants` for the per-token quant, `groups` for the per-group one: default
    `group_modes(GROUP_QUANT, GROUP_SIZES)`), N outer and M inner; shapes with a tensor over
    `MAX_TENSOR_BYTES`, and the per-group quant's at an N its group size does not divide, are
    left out."""
    itemsize = torch.finfo(getattr(torch, dtype)).bits // 8
    groups = group_modes(GROUP_QUANT, GROUP_SIZES) if groups is None else groups
    shapes: list[Shape] = []
    for kernel in kernels:
        options = REGISTRY[kernel].options
        if "group_size" in options:
            modes = groups
        elif "quant" in options:
            modes = [{"quant": q} for q in quants]
        else:
            modes = [{}]
        for opts in modes:
            group = opts.get("group_size") or 0
            shapes += [(kernel, opts, m, n) for n in ns for m in ms
                       if m * n * itemsize <= MAX_TENSOR_BYTES and n % max(group, 1) == 0]
    return shapes


def flags(text: str) -> list[bool]:
    """'false,true' as [False, True]."""
    values = {"false": False, "true": True}
    try:
        return [values[v.strip().lower()] for v in text.split(",")]
    except KeyError:
        raise SystemExit(f"expected a comma-separated list of true and false, got {text!r}"
                         ) from None


def shard(shapes: list[Shape], index: int, count: int) -> list[Shape]:
    """Shard `index` of `count` (one per GPU of a host): the shapes dealt out largest first,
    each to the shard with the least estimated work so far, then kept in suite order. A shape
    costs a few seconds of compiling and timing whatever its size, plus its elements' share."""
    if not 0 <= index < count:
        raise ValueError(f"shard {index}/{count}: the index must be in 0..{count - 1}")
    load = [0.0] * count
    owner: dict[int, int] = {}
    order = sorted(range(len(shapes)), key=lambda i: -shapes[i][2] * shapes[i][3])
    for i in order:
        k = min(range(count), key=lambda s: (load[s], s))
        owner[i] = k
        load[k] += 1.0 + shapes[i][2] * shapes[i][3] / 2**28  # 2^28 elements ~ one fixed cost
    return [s for i, s in enumerate(shapes) if owner[i] == index]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", default="rmsnorm_fwd",
                    help=f"comma-separated, of: {', '.join(REGISTRY)}")
    ap.add_argument("--m", default=",".join(map(str, SUITE_M)))
    ap.add_argument("--n", default=",".join(map(str, SUITE_N)))
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--quant", default="int8,fp8", help="quant modes for rmsnorm_quant_fwd")
    ap.add_argument("--group-quant", default=",".join(GROUP_QUANT),
                    help="quant modes for the per-group quant (fp8, int8)")
    ap.add_argument("--group-size", default=",".join(map(str, GROUP_SIZES)),
                    help="group sizes for the per-group quant (32 to 256; 0: one group a row)")
    ap.add_argument("--scale-ue8m0", default=None, metavar="false,true",
                    help="UE8M0 scales for the per-group quant (default: not, and unnamed)")
    ap.add_argument("--column-major-scales", default=None, metavar="false,true",
                    help="column-major scales for the per-group quant (default: not, unnamed)")
    ap.add_argument("--table", default=None, help="tuned table (default: the shipped one)")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--peers", default=None, metavar="NAME,...",
                    help="only these peers (e.g. torch-eager,liger; default: every one "
                         "installed)")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--resume", action="store_true",
                    help="keep the shapes already in --out (same device) and measure the rest")
    ap.add_argument("--shard", default=None, metavar="I/K",
                    help="measure only shard I of K (0-based): one process per GPU of a host")
    args = ap.parse_args()
    kernels = args.kernels.split(",")
    if unknown := [k for k in kernels if k not in REGISTRY]:
        ap.error(f"unknown kernels {', '.join(unknown)}; the kernels are {', '.join(REGISTRY)}")
    groups = group_modes(args.group_quant.split(","),
                         [int(v) for v in args.group_size.split(",")],
                         flags(args.scale_ue8m0) if args.scale_ue8m0 else None,
                         flags(args.column_major_scales) if args.column_major_scales else None)

    started = time.perf_counter()
    where = "cuda" if on_gpu() else "cpu"
    gpu = where == "cuda"
    props = torch.cuda.get_device_properties(0) if gpu else None
    device = device_name()
    copy = copy_bandwidth_gbps(where)
    tuned = tuned_table(args.table, device)
    peers: bool | set[str] = not args.no_peers
    if args.peers and peers:
        peers = set(args.peers.split(","))
    result: dict[str, Any] = {
        "device": device, "env": environment().__dict__, "peer_versions": peer_versions(),
        "copy_gbps": round(copy, 1) if copy else None,
        "l2_bytes": props.L2_cache_size if props else None,
        "sm_count": props.multi_processor_count if props else None,
        "method": "cuda-graph replay over rotating inputs (>4x L2), median; eager: back-to-back"
                  if gpu else "Triton interpreter: wall clock of a call, median (not a GPU's)",
        "rows": [],
    }
    out = Path(args.out)
    before = earlier_result(out, device) if args.resume else {}
    result["rows"] = before.get("rows", [])
    # Each process measures its own copy ceiling; its rows' frac_copy use that one.
    result["processes"] = [*before.get("processes", []), {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"), "copy_gbps": result["copy_gbps"],
        "kernels": args.kernels, "shard": args.shard,
        "gpu_uuid": str(props.uuid) if props else None}]
    done = done_shapes(result["rows"])
    print(f"{device}: copy {f'{copy:.0f} GB/s' if copy else 'not measured'}, "
          f"{len(tuned.entries) if tuned else 0} tuned entries, "
          f"{len(done)} shapes already measured")
    ms = [int(v) for v in args.m.split(",")]
    ns = [int(v) for v in args.n.split(",")]
    shapes = suite_shapes(kernels, args.quant.split(","), ms, ns, args.dtype, groups)
    if args.shard:
        index, count = (int(v) for v in args.shard.split("/"))
        shapes = shard(shapes, index, count)
    for kernel, opts, m, n in shapes:
        if shape_key(kernel, opts, m, n) in done:
            continue
        spec = REGISTRY[kernel]
        problem = spec.problem(m, n, args.dtype, **opts)
        same = None
        if gpu:  # the ceiling at this size: a copy of the kernel's bytes, timed alike
            same = copy_time_us(spec.bytes_moved(problem))
            result["rows"].append({
                "kernel": kernel, "m": m, "n": n, "dtype": args.dtype,
                "options": dict(problem.options),
                "impl": "copy (same bytes)", "gpu_us": round(same, 3),
                "gbps": round(spec.bytes_moved(problem) / same / 1e3, 1)})
        sets = input_sets(spec, problem, where, seed=m + n)
        for impl in implementations(spec, problem, tuned, peers):
            row = measure(spec, problem, impl.name, impl.prepare, impl.ours, sets, copy, same,
                          where, impl.tags)
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
        del sets
        if gpu:
            torch.cuda.empty_cache()
        write_json(out, result)  # whole: a run stopped mid-write keeps its last shape
        print(f"# {kernel} {opts} {m} x {n} done at {time.perf_counter() - started:.0f} s",
              flush=True)
    print(bench_markdown(result))  # per kernel, the worst shapes; per shape, each peer


if __name__ == "__main__":
    main()
