"""Quant's kernel timed beside copies of its module changed by source text: what a piece of its
device code costs, at the table's config (and any other), with the forward beside it.

    PYTHONPATH=src python benchmarks/quant_variants.py TABLE OUT.json \
        [--variants shipped,no_max,...] [--fwd-variants shipped,early_w] \
        [--shapes 4096x1024,...] [--configs extra.json] [--shard I/K]

Variants of `kerneltune/kernels/rmsnorm_quant.py`:
- `shipped`: as is;
- `no_round`: y = w · x · r in fp32, never rounded to x's dtype (no bf16 packing and unpacking);
- `no_max`: a row's max|y| taken as 1 (no reduction over y, nothing published for it);
- `light`: both;
- `late_release`: a whole row's program releases the next grid as it exits, not before its
  stores (the forward's LATE_RELEASE);
- `no_pdl`: as shipped, launched the ordinary way;
- `no_store`: a whole row's q neither computed nor stored (its scale still is);
- `read_only`: `light` and `no_store`: x read, r reduced, a scale stored a row; the least a
  kernel that reads x once takes at that config;
- `early_w`: a whole row's weight loaded with x, before the sum of squares, not after it;
- `packed` (bf16 on sm_90 or later): the weight kept as loaded, in x's dtype, and w times the
  rounded x·r taken two at a time in one `mul.rn.bf16x2`, where the shipped kernel widens both
  and rounds their fp32 product. The product of two bf16 values is exact in fp32, so both round
  it once: the same bits, with fewer instructions (and, the hope was, fewer registers);
- `deep`: the split of one row a block quantises the row two back in each step, not the row
  before, so that the maxima it waits for were published a whole step earlier;
- `free_max`: that split waits for no maxima at all (its scale made from the sums of squares):
  what the max agreement's wait costs, at most;
- `no_wait`: that split reads its peers' partials without waiting for any (timing only): what
  both agreements' waits cost, at most;
- `no_max_at_all`: `free_max` without the max reduction and its publish (timing only);
- `one_reduction`: that split reduces the next row's sum of squares and this row's max|y| in
  one reduction across its warps, one barrier a step where shipped takes two, and publishes both
  after it;
- `max_first`: that split makes this row's y and publishes its max before it stores the row
  before, not after (two rows' y held at once);
- `deep_packed`, `max_first_packed`: each with `packed`.
Only `shipped`, `late_release`, `no_pdl`, `early_w`, `packed`, `deep`, `deep_packed`,
`one_reduction`, `max_first` and `max_first_packed` compute the right values, and only theirs
are checked (a wrong one is noted in the output's `wrong`, not timed); the others are timing
only. `--configs` is a JSON list of partial configs, each completed from the table's pick and
timed too where valid. The output also holds, per timing, the registers, spilled bytes and
shared memory of the kernel it compiled (`compiled`).

`--fwd-variants` (default `shipped`) times the forward (`kerneltune/kernels/rmsnorm_fwd.py`)
beside it, at its pick and the same configs: `shipped`, `early_w` (a whole row's weight
loaded with x), `packed` (as quant's) or `no_wait` (as quant's: timing only; only the
variants in `CORRECT` are checked).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from kerneltune.env import device_name, environment
from kerneltune.kernels import REGISTRY
from kerneltune.table import Table
from kerneltune.table import load as load_table
from kerneltune.tuner.timing import copy_bandwidth_gbps, graph_time, rotation_count
from sweep_configs import completed

QUANT, FWD = REGISTRY["rmsnorm_quant_fwd"], REGISTRY["rmsnorm_fwd"]
NO_ROUND = [('''    y = w[None, :] * _cast(xhat, DTYPE, SOFT_ROUND).to(tl.float32)
    return _cast(y, DTYPE, SOFT_ROUND).to(tl.float32)''', "    return w[None, :] * xhat")]
# r has a row's shape at every site; x * 0 is not folded away (NaN), so no reduction is left.
NO_MAX = [("amax = tl.maximum(amax, tl.max(tl.abs(yt), axis=1))", "amax = amax"),
          ("amax = tl.maximum(amax, tl.abs(y))", "amax = amax"),
          ("tl.max(tl.abs(y), axis=1)", "(r * 0.0 + 1.0)")]
LATE_RELEASE = [("""            release_next_grid(PDL)
            scale, mul = _row_scale(amax, eps, min_scale, MODE, QMAX)""",
                 "            scale, mul = _row_scale(amax, eps, min_scale, MODE, QMAX)"),
                ("""                         mask_t, X_LAYOUT, dtype)
        else:""", """                         mask_t, X_LAYOUT, dtype)
            release_next_grid(PDL)
        else:""")]
# Every whole row's q goes through `_store_q`: with its store gone, q is never computed.
NO_STORE = [("    tl.store(ptrs, q, mask=mask)\n", "")]
# The weight's load is issued before the reduction's barrier rather than after it, so that its
# latency overlaps x's instead of lying between the row's two reductions.
EARLY_W = [("""            sq = tl.sum(x * x, axis=1)
            if TAIL > 0:
                xt, ct, mask_t = _load_part(x_rows, BLOCK_N, TAIL, row_ok, N, True, EVICT)
                sq += tl.sum(xt * xt, axis=1)
            r = tl.rsqrt(sq / N + eps)
            w, b = _affine(W, B, c, N, HAS_W, HAS_B)
""", """            w, b = _affine(W, B, c, N, HAS_W, HAS_B)
            sq = tl.sum(x * x, axis=1)
            if TAIL > 0:
                xt, ct, mask_t = _load_part(x_rows, BLOCK_N, TAIL, row_ok, N, True, EVICT)
                sq += tl.sum(xt * xt, axis=1)
            r = tl.rsqrt(sq / N + eps)
""")]
FWD_EARLY_W = [("""            r = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
            w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)
""", """            w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)
            r = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
""")]
#: w · (x·r rounded) as one bf16x2 multiply of the weight as loaded (see the docstring).
BF16X2_MUL = 'tl.inline_asm_elementwise("mul.rn.bf16x2 $0, $1, $2;", "=r,r,r", '
PACKED = [("        w = tl.load(W + c, mask=c < N, other=0.0).to(tl.float32)\n",
           "        w = tl.load(W + c, mask=c < N, other=0.0)\n"),
          ("""    y = w[None, :] * _cast(xhat, DTYPE, SOFT_ROUND).to(tl.float32)
    return _cast(y, DTYPE, SOFT_ROUND).to(tl.float32)""",
           f"""    y = {BF16X2_MUL}[w[None, :], _cast(xhat, DTYPE, SOFT_ROUND)],
                                  dtype=w.dtype, is_pure=True, pack=2)
    return y.to(tl.float32)""")]
FWD_PACKED = [(f"w = tl.load(W + {cols}, mask={ok}, other=0.0).to(tl.float32)",
               f"w = tl.load(W + {cols}, mask={ok}, other=0.0)")
              for cols, ok in (("cols", "col_ok"), ("cols", "cols < N"), ("c", "c < N"))] + [
    ("        y = w * (x * r).to(OUT).to(tl.float32)",
     f"        y = {BF16X2_MUL}[w, (x * r).to(OUT)], dtype=w.dtype,\n"
     "                                      is_pure=True, pack=2)")]
#: The split of one row a block quantises row k - 2 in the step of row k, not row k - 1: peers
#: publish row k - 1's maxima late in their step, row k - 2's a whole step before. (`prev` now
#: names the row two back; the lane's last two rows are stored after the loop.) The H100's
#: `slack2` (`benchmarks/results/nvidia-h100-80gb-hbm3/quant-split/slack.py`) in this tool.
DEEP = [("""    for row in tl.range(lane, M, n_lanes, num_stages=STAGES):
""", """    y_prev2 = tl.zeros([1, BLOCK_N], dtype=y_prev.dtype)
    for row in tl.range(lane, M, n_lanes, num_stages=STAGES):
"""),
        ("            prev = row - n_lanes\n", "            prev = row - 2 * n_lanes\n"),
        ("_store_row_quantised(Q, SCALE, y_prev, tl.max(max_prev), prev,",
         "_store_row_quantised(Q, SCALE, y_prev2, tl.max(max_prev), prev,"),
        ("""            y_prev = y.to(y_prev.dtype)
        x = x_ahead
    if PHASE == 0 or PHASE == 3:
        last = lane + (M - 1 - lane) // n_lanes * n_lanes
        max_last = gather_row(PART_MAX, last, NQ, NQ_POW2, PHASE == 0)
""", """            # Not y_prev itself: Triton 3.6's pipeliner leaves a loop alone where an
            # iteration passes on a value it received unchanged; a select it cannot fold
            # (lane < n_lanes always holds) hides that.
            y_prev2 = tl.where(lane < n_lanes, y_prev, y_prev2)
            y_prev = y.to(y_prev.dtype)
        x = x_ahead
    if PHASE == 0 or PHASE == 3:
        last = lane + (M - 1 - lane) // n_lanes * n_lanes
        max_last, max_before = gather_row_pair(PART_MAX, last, PART_MAX, last - n_lanes, NQ,
                                               NQ_POW2, PHASE == 0)
        _store_row_quantised(Q, SCALE, y_prev2, tl.max(max_before), last - n_lanes, q, cols,
                             col_ok, stride_q, M, eps, min_scale, NQ_POW2, MODE, QMAX,
                             SOFT_ROUND)
""")]
#: The split of one row a block waits for this row's sums of squares alone, its scale taken
#: from them as if they were the row before's maxima: no wait on the max agreement (timing only).
FREE_MAX = [("sq_parts, max_prev = gather_row_pair(PART_SQ, row, PART_MAX, prev, NQ, NQ_POW2,\n"
             "                                                     PHASE == 0)",
             "sq_parts = gather_row(PART_SQ, row, NQ, NQ_POW2, PHASE == 0)\n"
             "                max_prev = sq_parts")]
#: The split of one row a block reads its peers' partials without waiting for them (timing
#: only): what both agreements' waits cost, at most.
NO_WAIT = [("NQ_POW2,\n                                                     PHASE == 0)",
            "NQ_POW2,\n                                                     False)")]
#: `free_max` with no max|y| at all: nothing reduced over y or published for it, so the lane's
#: last row must not wait for its maxima either (timing only).
NO_MAX_AT_ALL = [*FREE_MAX, ("""            if PHASE <= 2:
                publish(PART_MAX, row, q, NQ, M, tl.max(tl.abs(y), axis=1), 1)
            y_prev = y.to(y_prev.dtype)""", """            y_prev = y.to(y_prev.dtype)"""),
                 ("max_last = gather_row(PART_MAX, last, NQ, NQ_POW2, PHASE == 0)",
                  "max_last = gather_row(PART_MAX, last, NQ, NQ_POW2, False)")]
#: The split of one row a block reduces the next row's sum of squares and this row's max|y|
#: together, in one reduction across the program's warps (one barrier a step, not two), and
#: publishes both after it: the sums half a step later than shipped, as the maxima already are.
#: PHASE 2 takes the same reduction (its sums unused), so that the interpreter runs it.
ONE_REDUCTION = [
    ("@triton.jit\ndef _quantise_split_rows(", """@triton.jit
def _sum_and_max(s0, m0, s1, m1):
    return s0 + s1, tl.maximum(m0, m1)


@triton.jit
def _quantise_split_rows("""),
    ("""        if PHASE <= 1:
            xf = _widen(x_ahead, SOFT_ROUND)
            publish(PART_SQ, row + n_lanes, q, NQ, M, tl.sum(xf * xf, axis=1), 1)
        if PHASE != 1:
            prev = row - n_lanes""", """        if PHASE == 1:
            xf = _widen(x_ahead, SOFT_ROUND)
            publish(PART_SQ, row + n_lanes, q, NQ, M, tl.sum(xf * xf, axis=1), 1)
        if PHASE != 1:
            prev = row - n_lanes"""),
    ("""            if PHASE <= 2:
                publish(PART_MAX, row, q, NQ, M, tl.max(tl.abs(y), axis=1), 1)
            y_prev = y.to(y_prev.dtype)""", """            if PHASE <= 2:
                xf = _widen(x_ahead, SOFT_ROUND)
                sq_next, y_max = tl.reduce((xf * xf, tl.abs(y)), 1, _sum_and_max)
                if PHASE == 0:
                    publish(PART_SQ, row + n_lanes, q, NQ, M, sq_next, 1)
                publish(PART_MAX, row, q, NQ, M, y_max, 1)
            y_prev = y.to(y_prev.dtype)""")]
#: The split of one row a block makes this row's y and publishes its maxima before it stores
#: the row before, not after: the maxima its peers wait for next go out a store earlier, while
#: a thread holds two rows' y (the H100's order before `quant-store-first/`).
_STORE_FIRST = ("            if PHASE != 2:  # the row before goes first: its y is gone before "
                "this row's is made\n")
_STORE_PREV = """\
                _store_row_quantised(Q, SCALE, y_prev, tl.max(max_prev), prev, q, cols, col_ok,
                                     stride_q, M, eps, min_scale, NQ_POW2, MODE, QMAX,
                                     SOFT_ROUND)
"""
_MAKE_Y = """\
            r = tl.rsqrt(tl.sum(sq_parts) / N + eps) + tl.zeros([1], dtype=tl.float32)
            y = _normed(_widen(x, SOFT_ROUND), r, w, b, MODE, HAS_W, HAS_B, dtype, SOFT_ROUND)
            if PHASE <= 2:
                publish(PART_MAX, row, q, NQ, M, tl.max(tl.abs(y), axis=1), 1)
"""
MAX_FIRST = [(_STORE_FIRST + _STORE_PREV + _MAKE_Y,
              _MAKE_Y + "            if PHASE != 2:\n" + _STORE_PREV)]
VARIANTS = {"shipped": [], "no_round": NO_ROUND, "no_max": NO_MAX, "light": NO_ROUND + NO_MAX,
            "late_release": LATE_RELEASE, "no_pdl": [], "no_store": NO_STORE,
            "read_only": NO_ROUND + NO_MAX + NO_STORE, "early_w": EARLY_W, "packed": PACKED,
            "deep": DEEP, "deep_packed": DEEP + PACKED, "free_max": FREE_MAX,
            "no_wait": NO_WAIT, "no_max_at_all": NO_MAX_AT_ALL,
            "one_reduction": ONE_REDUCTION, "max_first": MAX_FIRST,
            "max_first_packed": MAX_FIRST + PACKED}
CORRECT = ("shipped", "late_release", "no_pdl", "early_w", "packed", "deep", "deep_packed",
           "one_reduction", "max_first", "max_first_packed")
#: Variants whose inline PTX only a GPU compiles: the interpreter cannot run them.
GPU_ONLY = ("packed", "deep_packed", "max_first_packed")
#: The forward's split of one row a block reads its peers' partials without waiting (timing
#: only), as quant's `no_wait`.
FWD_NO_WAIT = [("gather_row(PART, row, NQ, NQ_POW2, PHASE == 0)",
                "gather_row(PART, row, NQ, NQ_POW2, False)")]
FWD_VARIANTS = {"shipped": [], "early_w": FWD_EARLY_W, "packed": FWD_PACKED,
                "no_wait": FWD_NO_WAIT}
SHAPES = "4096x1024,4096x5120,4096x14336,16384x5120,16384x8192,4096x32768,16384x65536,4096x262144"


def variant(name: str, folder: Path, spec_of: Any = QUANT,
            variants: dict[str, list[tuple[str, str]]] = VARIANTS) -> ModuleType:
    """The kernel module of `spec_of` with `variants[name]`'s replacements, imported apart."""
    text = Path(spec_of.kernel_module.__file__).read_text()
    for old, new in variants[name]:
        if old not in text:
            raise SystemExit(f"{name}: source text not found: {old!r}")
        text = text.replace(old, new)
    path = folder / f"{spec_of.name}_{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


KERNELS = ("_rmsnorm_quant_kernel", "_rmsnorm_quant_coop_kernel")


def compiled(module: ModuleType) -> list[dict[str, int]]:
    """Registers a thread, bytes spilled a thread and shared memory of each kernel of `module`
    compiled since its caches were cleared."""
    torch.cuda.synchronize()
    return [{"regs": k.n_regs, "spilled": k.n_spills, "shared": k.metadata.shared}
            for fn in KERNELS for cache in getattr(module, fn).device_caches.values()
            for k in cache[0].values()]


def valid_configs(spec_of: Any, problem: Any, extra: list[dict[str, Any]],
                  table: Table) -> list[dict[str, Any]]:
    """The table's pick, then each partial config of `extra` completed from it, where valid
    (a parameter the kernel's space lacks is dropped: the forward has no PARTS or X_LAYOUT)."""
    known = spec_of.space(problem)
    extra = [{k: v for k, v in c.items() if k in known} for c in extra]
    configs: list[dict[str, Any]] = []
    for config in completed(spec_of, problem, [{}, *extra], table):
        config = spec_of.normalize(problem, config)
        if config not in configs and spec_of.valid(problem, config):
            configs.append(config)
    return configs


def wrong(spec_of: Any, inputs: dict[str, Any], outputs: Any, row: dict[str, Any], field: str,
          key: str) -> bool:
    """Whether `outputs` fail `spec_of`'s check; if so, why is noted in row[field][key] (and
    printed), so that the sweep goes on without timing them."""
    why = spec_of.check(inputs, outputs)
    if why:
        row.setdefault(field, {})[key] = why
        print(f"{spec_of.name} {key} at {row['m']} x {row['n']}: {why}", flush=True)
    return why is not None


def time_shape(m: int, n: int, extra: list[dict[str, Any]], modules: dict[str, ModuleType],
               fwd_modules: dict[str, ModuleType], table: Table, copy: float) -> dict[str, Any]:
    """Every quant variant at every config of one shape, both modes, and every forward variant
    at every config of the forward (its pick first)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    sets = rotation_count(3 * m * n)
    xs = [torch.randn(m, n, device="cuda", generator=g).bfloat16() for _ in range(sets)]
    w = (1 + 0.25 * torch.randn(n, device="cuda", generator=g)).bfloat16()
    configs = valid_configs(QUANT, QUANT.problem(m, n, "bfloat16"), extra, table)
    row: dict[str, Any] = {"m": m, "n": n, "configs": configs, "us": {}}
    for c, config in enumerate(configs):
        for mode in ("int8", "fp8"):
            inputs = {"x": xs[0], "weight": w, "bias": None, "eps": 1e-6, "quant": mode}
            for name, module in modules.items():
                pdl = False if name == "no_pdl" else None

                def run(i: int, module=module, mode=mode, config=config, pdl=pdl) -> Any:
                    return module.rmsnorm_quant_fwd(xs[i], w, None, 1e-6, mode, config, pdl)

                for fn in KERNELS:  # compiled afresh, to read what this config's kernel takes
                    getattr(module, fn).device_caches.clear()
                out = run(0)
                row.setdefault("compiled", {})[f"{c}/{mode}/{name}"] = compiled(module)
                if name in CORRECT and wrong(QUANT, inputs, out, row, "wrong",
                                             f"{c}/{mode}/{name}"):
                    continue
                row["us"][f"{c}/{mode}/{name}"] = graph_time(run, sets).median_us
    fwd_configs = valid_configs(FWD, FWD.problem(m, n, "bfloat16"), extra, table)
    row["fwd_configs"] = fwd_configs
    row["fwd_us"] = {}
    inputs = {"x": xs[0], "weight": w, "eps": 1e-6, "offset": 0.0}
    for c, config in enumerate(fwd_configs):
        for name, module in fwd_modules.items():

            def run_fwd(i: int, module=module, config=config) -> Any:
                return module.rmsnorm_fwd(xs[i], w, 1e-6, 0.0, config)

            if name in CORRECT and wrong(FWD, inputs, run_fwd(0), row, "fwd_wrong",
                                         f"{c}/{name}"):
                continue
            row["fwd_us"][f"{c}/{name}"] = graph_time(run_fwd, sets).median_us
    row["of_copy"] = {k: 3 * m * n / (v * 1e3) / copy for k, v in row["us"].items()}
    row["fwd_of_copy"] = {k: 4 * m * n / (v * 1e3) / copy for k, v in row["fwd_us"].items()}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("table")
    ap.add_argument("out")
    ap.add_argument("--variants", default="shipped,no_round,no_max,light")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--fwd-variants", default="shipped",
                    help="forward variants, e.g. shipped,early_w")
    ap.add_argument("--configs", default=None, help="JSON file: partial configs to time too")
    ap.add_argument("--shard", default="0/1", metavar="I/K")
    args = ap.parse_args()
    index, count = map(int, args.shard.split("/"))
    table = load_table(Path(args.table))
    extra = json.loads(Path(args.configs).read_text()) if args.configs else []
    copy = copy_bandwidth_gbps("cuda")
    result = {"device": device_name(), "env": environment().__dict__, "copy_gbps": copy,
              "shapes": []}
    with tempfile.TemporaryDirectory() as tmp:
        modules = {name: variant(name, Path(tmp)) for name in args.variants.split(",")}
        fwd_modules = {name: variant(name, Path(tmp), FWD, FWD_VARIANTS)
                       for name in args.fwd_variants.split(",") if name}
        for shape in args.shapes.split(",")[index::count]:
            m, n = map(int, shape.split("x"))
            row = time_shape(m, n, extra, modules, fwd_modules, table, copy)
            result["shapes"].append(row)
            print(shape, {k: round(v, 2) for k, v in {**row["us"], **row["fwd_us"]}.items()},
                  flush=True)
            # Written after every shape: a sweep cut short keeps what it timed.
            Path(args.out).write_text(json.dumps(result, indent=1))
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
