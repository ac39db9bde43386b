"""Quant's one-row split holding more of the rows on an SM, and two ways to hold less of each
row a thread: registers and spills counted offline, outputs compared with the shipped split's,
then timed (`time`, `../quant-split/slack.py`'s harness), or the tuner's sweep run (`sweep`).

    PYTHONPATH=src:benchmarks python .../quant-resident/probe.py regs             # no GPU
    PYTHONPATH=src:benchmarks python .../quant-resident/probe.py compiled         # on the GPU
    PYTHONPATH=src:benchmarks python .../quant-resident/probe.py time out.json MxN,... \
        [VARIANT,...] [SPLIT,...]
    PYTHONPATH=src:benchmarks python .../quant-resident/probe.py once MODE SPLIT  # for ncu
    PYTHONPATH=src:benchmarks python .../quant-resident/probe.py sweep SWEEP_ARGS...

`sweep` runs `benchmarks/sweep_configs.py` with its arguments (the tuner's timing, each output
checked against the float64 reference first) where the spec also allows the splits below.

A split step of a lane takes about 1.17 us plus 0.093 us per 1K elements its programs hold on
an SM (`README.md`), so holding more rows an SM means fewer, longer steps closer to the
bandwidth. A program holds, per element, its row x, the next row (loaded a step ahead for its
sum of squares), y of the row before (waiting for its max) and the weight: at 64 elements a
thread that is 128 registers of data alone, and the splits that hold 24K elements an SM spill.
Each variant keeps three of those arrays:

- `w_step`: the weight chunk loaded again each step (from L1/L2). The load's pointer varies
  with the row (`row // M`, always 0), so it is not hoisted out of the loop. Only compiled: it
  spills more than the shipped code.
- `reread` (`_plain`, `_first`: other eviction hints): the next row loaded for its sum of
  squares only, and each row loaded again at the step that computes its y.
- `late_sq`: the next row loaded, and its sum of squares published, at the end of the step
  rather than its start, after this row's x has become y: read once, but the sums are waited
  for right after they are published.

GRID_MULT 5, 6 and 10 and a staging budget of 200 KB an SM are allowed here (the spec allows
1, 2, 3, 4, 8 and 128 KB). Only the one-row split changes; every other path keeps the shipped
code.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "quant-split"))
sys.path.insert(0, str(Path(__file__).parents[1] / "quant-unpack"))

import slack as harness
from unpack import variant

import kerneltune.kernels.rmsnorm_fwd_spec as forward_spec

forward_spec.GRID_MULTS = (1, 2, 3, 4, 5, 6, 8, 10)
forward_spec.MAX_STAGED_BYTES_PER_SM = 200 * 1024

W_STEP = [
    ("def _quantise_split_rows(PART_SQ, PART_MAX, NQ, X, Q, SCALE, stride_x, stride_q, M, N, "
     "eps,\n                         min_scale, x, w, b, lane,",
     "def _quantise_split_rows(PART_SQ, PART_MAX, NQ, X, Q, SCALE, stride_x, stride_q, M, N, "
     "eps,\n                         min_scale, x, w, b, W, B, lane,", 1),
    ("                             min_scale, x, w, b, lane, n_lanes, q, cols, col_ok, NQ_POW2,",
     "                             min_scale, x, w, b, W, B, lane, n_lanes, q, cols, col_ok,"
     " NQ_POW2,", 1),
    ("            r = tl.rsqrt(tl.sum(sq_parts) / N + eps) + tl.zeros([1], dtype=tl.float32)\n"
     "            y = _normed(_widen(x, SOFT_ROUND), r, w, b, MODE, HAS_W, HAS_B, dtype, "
     "SOFT_ROUND)\n            if PHASE <= 2:\n"
     "                publish(PART_MAX, row, q, NQ, M, tl.max(tl.abs(y), axis=1), 1)\n",
     "            r = tl.rsqrt(tl.sum(sq_parts) / N + eps) + tl.zeros([1], dtype=tl.float32)\n"
     "            w, b = _affine(W + row // M, B + row // M, cols, N, HAS_W, HAS_B)\n"
     "            y = _normed(_widen(x, SOFT_ROUND), r, w, b, MODE, HAS_W, HAS_B, dtype, "
     "SOFT_ROUND)\n            if PHASE <= 2:\n"
     "                publish(PART_MAX, row, q, NQ, M, tl.max(tl.abs(y), axis=1), 1)\n", 1),
]

LOAD_POLICY = '''

@triton.jit
def _load_row(X, row, cols, col_ok, stride_x, M, EVICT: tl.constexpr, POLICY: tl.constexpr):
    """Row `row`'s columns `cols` of X as stored (1 x BLOCK_N; nothing past M), with POLICY."""
    rows = row + tl.arange(0, 1)
    ptrs = X + rows.to(tl.int64)[:, None] * stride_x + cols[None, :]
    mask = (rows < M)[:, None] & col_ok[None, :]
    if EVICT:
        return tl.load(ptrs, mask=mask, other=0.0, eviction_policy=POLICY)
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _store_row_quantised('''

#: The next row loaded for its sum of squares only (kept in L2: evict_last), and this row
#: loaded again where y needs it (evict_first): no row is carried from step to step, so a
#: thread holds three arrays of its elements, not four; both loads are staged by the pipeliner.
REREAD = [
    ("\n\n@triton.jit\ndef _store_row_quantised(", LOAD_POLICY, 1),
    ("        x_ahead = load_rows(X, row + n_lanes, cols, col_ok, stride_x, M, 1, EVICT)\n"
     "        if PHASE <= 1:\n"
     "            xf = _widen(x_ahead, SOFT_ROUND)\n",
     "        if PHASE <= 1:\n"
     "            xf = _widen(_load_row(X, row + n_lanes, cols, col_ok, stride_x, M, EVICT,\n"
     "                                  \"evict_last\"), SOFT_ROUND)\n", 1),
    ("            r = tl.rsqrt(tl.sum(sq_parts) / N + eps) + tl.zeros([1], dtype=tl.float32)\n"
     "            y = _normed(_widen(x, SOFT_ROUND),",
     "            r = tl.rsqrt(tl.sum(sq_parts) / N + eps) + tl.zeros([1], dtype=tl.float32)\n"
     "            x = _load_row(X, row, cols, col_ok, stride_x, M, EVICT, \"evict_first\")\n"
     "            y = _normed(_widen(x, SOFT_ROUND),", 1),
    ("            y_prev = y.to(y_prev.dtype)\n        x = x_ahead\n"
     "    if PHASE == 0 or PHASE == 3:\n        last = lane + (M - 1 - lane)",
     "            y_prev = y.to(y_prev.dtype)\n    if PHASE == 0 or PHASE == 3:\n"
     "        last = lane + (M - 1 - lane)", 1),
]

#: The shipped row loop (`_quantise_split_rows`), from its `for` to its last statement.
LOOP = re.search(r"    for row in tl\.range\(lane, M, n_lanes, num_stages=STAGES\):\n.*?"
                 r"        x = x_ahead\n", harness.SOURCE, re.S).group(0)

#: The next row loaded and its sum of squares published at the end of the step, after this
#: row's y and the row before's store: x dies before the next row is read, so a thread holds
#: three arrays at a time, and each row is read once; the sums then have no step of slack.
#: (The shipped loop's lines, its first four moved to the end.)
_LINES = LOOP.splitlines(keepends=True)
assert _LINES[1].lstrip().startswith("x_ahead = ") and _LINES[-1].strip() == "x = x_ahead"
LATE_SQ_LOOP = "".join([_LINES[0], *_LINES[5:-1],
                        *(line.replace("x_ahead", "x") for line in _LINES[1:5])])
LATE_SQ = [(LOOP, LATE_SQ_LOOP, 1)]

#: The two loads' eviction policies in REREAD, for its variants (`reread_plain`: neither load
#: hinted; `reread_first`: both evict_first).
NEXT_POLICY, THIS_POLICY = '"evict_last"), SOFT_ROUND)', '"evict_first")\n            y ='


#: (BLOCK_N, num_warps, GRID_MULT, num_stages): 16K, 24K and 32K elements an SM.
SPLITS = [(4096, 4, 4, 3), (4096, 2, 6, 3), (8192, 4, 3, 3), (4096, 4, 6, 3), (4096, 2, 8, 2),
          (8192, 4, 4, 2)]


def registers(names: list[str], m: int = 4096, n: int = 262144) -> None:
    """Registers, spill instructions and shared memory of each variant's splits, compiled for
    sm_90 without a GPU (its launches recorded as `device_code.py` records them)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from device_code import COMPILE_OPTIONS, _as_h100, _signature, recorded_launches
    from kerneltune.kernels import REGISTRY, _coop, rmsnorm_quant_spec
    from sass_mix import _cubin_tool, opcodes

    spec = REGISTRY["rmsnorm_quant_fwd"]
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            module = harness.load(name, Path(tmp))
            _as_h100([module, _coop])
            rmsnorm_quant_spec.rmsnorm_quant_fwd = module.rmsnorm_quant_fwd
            for split in SPLITS:
                for mode in ("int8", "fp8"):
                    problem = spec.problem(m, n, "bfloat16", quant=mode)
                    fn, _, args, kwargs = recorded_launches(
                        spec, problem, harness.configs(m, n, [split])[-1])[0]
                    options = {k: kwargs[k] for k in COMPILE_OPTIONS if k in kwargs}
                    compiled = triton.compile(ASTSource(fn, *_signature(fn, args, kwargs)),
                                              target=GPUTarget("cuda", 90, 32), options=options)
                    cubin = compiled.asm["cubin"]
                    usage = _cubin_tool("cuobjdump", cubin, "--dump-resource-usage")
                    ops = opcodes(_cubin_tool("nvdisasm", cubin, "-c"))
                    print(f"{name:8} {mode} {split}: {usage.split('REG:')[1].split()[0]} "
                          f"registers, {ops.count('STL')} STL, {ops.count('LDL')} LDL, "
                          f"{ops.count('LDGSTS')} LDGSTS, {compiled.metadata.shared} B shared",
                          flush=True)


def compiled(m: int = 4096, n: int = 262144) -> None:
    """Registers, spilled bytes a thread and shared memory of the shipped kernel's splits as
    the GPU's own Triton compiles them (one call each)."""
    import torch

    from kerneltune.kernels import rmsnorm_quant

    x = torch.randn(m, n, device="cuda").bfloat16()
    w = torch.ones(n, device="cuda").bfloat16()
    props = torch.cuda.get_device_properties(0)
    print(props.name, "smem/SM", props.shared_memory_per_multiprocessor, "regs/SM",
          props.regs_per_multiprocessor)
    kernel = rmsnorm_quant._rmsnorm_quant_coop_kernel
    for split in SPLITS[:3]:
        for mode in ("int8", "fp8"):
            kernel.device_caches.clear()
            rmsnorm_quant.rmsnorm_quant_fwd(x, w, None, 1e-6, mode,
                                            harness.configs(m, n, [split])[-1])
            torch.cuda.synchronize()
            for cache in kernel.device_caches.values():
                for k in cache[0].values():
                    print(split, mode, "regs", k.n_regs, "spills", k.n_spills, "shared",
                          k.metadata.shared, "max_threads", k.n_max_threads, flush=True)


def once(mode: str, split: str, m: int = 4096, n: int = 262144) -> None:
    """A warm-up call and one measured call of the split BLOCK_N/num_warps/GRID_MULT/num_stages
    (ncu: --launch-skip 1 --launch-count 1)."""
    import torch

    from kerneltune.kernels import rmsnorm_quant

    x, w = harness.inputs(m, n, 1)
    config = harness.configs(m, n, [tuple(map(int, split.split("/")))])[-1]
    for _ in range(2):
        rmsnorm_quant.rmsnorm_quant_fwd(x[0], w, None, 1e-6, mode, config)
    torch.cuda.synchronize()


if __name__ == "__main__":
    harness.VARIANTS = {"shipped": harness.SOURCE, "w_step": variant(W_STEP),
                        "reread": variant(REREAD), "late_sq": variant(LATE_SQ),
                        "reread_plain": variant(REREAD).replace(NEXT_POLICY, '""), SOFT_ROUND)')
                        .replace(THIS_POLICY, '"")\n            y ='),
                        "reread_first": variant(REREAD).replace(
                            NEXT_POLICY, '"evict_first"), SOFT_ROUND)')}
    if sys.argv[1] == "regs":
        registers(list(harness.VARIANTS))
    elif sys.argv[1] == "compiled":
        compiled()
    elif sys.argv[1] == "once":
        once(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "time":  # the table's config and SPLITS, each variant, both modes
        args = [*sys.argv[4:], "", ""]
        splits = [tuple(map(int, s.split("/"))) for s in args[1].split(",") if s] or SPLITS
        harness.timed(Path(sys.argv[2]), sys.argv[3].split(","),
                      args[0].split(",") if args[0] else ["shipped", "reread"], splits)
    else:
        import sweep_configs

        sys.argv = ["sweep_configs.py", *sys.argv[2:]]
        sweep_configs.main()
