"""Quant's one-row split with its weight re-read every step rather than held in registers,
beside the split as shipped: registers and spills counted offline, outputs compared with the
shipped split's, then timed, at splits that hold more of the rows on an SM.

    PYTHONPATH=src:benchmarks python .../quant-resident/probe.py regs             # no GPU
    PYTHONPATH=src:benchmarks python .../quant-resident/probe.py compiled         # on the GPU
    PYTHONPATH=src:benchmarks python .../quant-resident/probe.py once MODE SPLIT  # for ncu
    PYTHONPATH=src:benchmarks python .../quant-resident/probe.py sweep SWEEP_ARGS...

`sweep` runs `benchmarks/sweep_configs.py` with its arguments (the tuner's timing, each output
checked against the float64 reference first) where the spec also allows the splits below.

A split step of a lane takes about 1.35 us plus 0.073 us per 1K elements its programs hold on
an SM (`README.md`), so holding more rows an SM means fewer, longer steps closer to the
bandwidth. A program holds, per element, its row x, the next row (loaded a step ahead for its
sum of squares), y of the row before (waiting for its max) and the weight: at 64 elements a
thread that is 128 registers of data alone, and the splits that hold 24K elements an SM spill.

- `w_step`: the weight chunk loaded again each step (from L1/L2: 2 bytes an element an SM
  already holds), so a thread keeps three arrays, not four. The load's pointer varies with
  the row (`row // M`, always 0), so it is not hoisted out of the loop.

GRID_MULT 6 and a staging budget of 200 KB an SM are allowed here (the spec allows 1, 2, 3, 4,
8 and 128 KB). Only the one-row split changes; every other path keeps the shipped code.
`w_step` was only compiled (`regs`): it spills more than the shipped code, so it was not timed.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "quant-split"))
sys.path.insert(0, str(Path(__file__).parents[1] / "quant-unpack"))

import slack as harness
from unpack import variant

import kerneltune.kernels.rmsnorm_fwd_spec as forward_spec

forward_spec.GRID_MULTS = (1, 2, 3, 4, 6, 8)
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

#: (BLOCK_N, num_warps, GRID_MULT, num_stages): 16K and 24K elements an SM.
SPLITS = [(4096, 4, 4, 3), (4096, 2, 6, 3), (8192, 4, 3, 3), (4096, 4, 6, 3)]


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
    harness.VARIANTS = {"shipped": harness.SOURCE, "w_step": variant(W_STEP)}
    if sys.argv[1] == "regs":
        registers(list(harness.VARIANTS))
    elif sys.argv[1] == "compiled":
        compiled()
    elif sys.argv[1] == "once":
        once(sys.argv[2], sys.argv[3])
    else:
        import sweep_configs

        sys.argv = ["sweep_configs.py", *sys.argv[2:]]
        sweep_configs.main()
