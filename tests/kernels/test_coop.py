"""The cooperative row split (COOP): its space and default in the kernels that share it, its
grid and launches, and the hash that covers its shared code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from offline import compiled_offline

from kerneltune.kernels import (
    REGISTRY,
    BackwardConfig,
    RowTilingConfig,
    _coop,
    _coop_dependent,
    _coop_norm,
    _coop_pair,
    _coop_row,
    _dependent_launch,
    _spec,
    add_rmsnorm,
    layernorm,
    layernorm_bwd,
    rmsnorm_bwd,
    rmsnorm_fwd,
    rmsnorm_fwd_spec,
    rmsnorm_group_quant,
    rmsnorm_quant,
)
from kerneltune.kernels._coop import gather, publish
from kerneltune.kernels._coop_pair import gather_pair
from kerneltune.kernels._spec import sm_count
from kerneltune.kernels.rmsnorm_fwd_spec import (
    MAX_COOP,
    MAX_STAGED_BYTES_PER_SM,
    RowTiled,
    staged_bytes_per_sm,
)
from kerneltune.kernels.rmsnorm_quant import _widen

SPLIT_KERNELS = ["rmsnorm_fwd", "add_rmsnorm_fwd", "rmsnorm_quant_fwd"]
#: The backwards whose rows split (DW = "split"), their dw (and db) summed over the lanes.
BACKWARD_SPLITS = ["rmsnorm_bwd", "layernorm_bwd"]


def test_the_family_splits_rows_alike() -> None:
    assert sorted(k for k, s in REGISTRY.items() if isinstance(s, RowTiled)) == sorted(
        SPLIT_KERNELS)


@pytest.mark.parametrize("kernel", SPLIT_KERNELS)
def test_split_space_and_default(kernel: str) -> None:
    """A split takes 2 to MAX_COOP chunks of at least MIN_LOOP_BLOCK columns, whole; the
    default splits rows that all take few programs, and from the kernel's `long_rows` on,
    any."""
    spec = REGISTRY[kernel]
    problem = spec.problem(16, 65536)
    split = spec.default(problem).replace(COOP=True, BLOCK_N=8192)
    assert spec.valid(problem, split)
    assert not spec.valid(problem, split.replace(SINGLE=True))
    assert not spec.valid(problem, split.replace(BLOCK_N=256))  # chunks too short to pay
    assert not spec.valid(spec.problem(16, 8192), split)  # one chunk is no split
    assert not spec.valid(spec.problem(16, 8192 * 2 * MAX_COOP), split)  # too many chunks
    # Programs per SM: up to 32 warps, their register blocks up to 32K elements in all.
    assert spec.valid(problem, split.replace(GRID_MULT=4, num_warps=8, BLOCK_N=4096))
    assert not spec.valid(problem, split.replace(GRID_MULT=4, num_warps=16))
    assert not spec.valid(problem, split.replace(GRID_MULT=4, BLOCK_N=16384))
    assert not spec.valid(problem, split.replace(GRID_MULT=5))
    # Twelve one-warp programs of 2K (quant's), not sixteen: some GPUs hold 16 blocks an SM.
    one_warp = split.replace(BLOCK_N=2048, num_warps=1)
    assert spec.valid(problem, one_warp.replace(GRID_MULT=12))
    assert not spec.valid(problem, one_warp.replace(BLOCK_N=1024, GRID_MULT=16))
    assert not spec.valid(problem, spec.default(spec.problem(16, 4096)).replace(GRID_MULT=2))
    assert {c.COOP for c in spec.configs(problem)} == {True, False}
    assert spec.default(spec.problem(16, 65536)).COOP is True
    long_rows = spec.default(spec.problem(4096, spec.long_rows))
    assert long_rows.COOP is True
    assert (long_rows.BLOCK_N, long_rows.ROWS, long_rows.num_warps,
            long_rows.GRID_MULT, long_rows.num_stages) == spec.long_row_split
    assert spec.default(spec.problem(4096, spec.long_rows // 2)).COOP is False
    assert spec.default(spec.problem(16, 4096)).COOP is False  # a whole row fits


@pytest.mark.parametrize("kernel", SPLIT_KERNELS)
def test_stages_only_for_splits_of_one_row_whose_kernel_loads_rows_ahead(kernel: str) -> None:
    """num_stages > 1 pipelines the split's row loop: only one row a block of the forward's and
    quant's splits, and only as many stages as fit MAX_STAGED_BYTES_PER_SM beside each other,
    counting num_stages - 1 chunks of x a program, the buffers Triton allocates (four programs
    of 4K bf16 chunks: 5 stages; of 8K: 3)."""
    spec = REGISTRY[kernel]
    problem = spec.problem(4096, 65536)
    split = spec.default(problem).replace(COOP=True, SINGLE=False, BLOCK_N=4096, ROWS=1,
                                          num_warps=4, GRID_MULT=4, num_stages=1)
    assert spec.valid(problem, split)
    staged = split.replace(num_stages=4)
    assert spec.staged_splits is (kernel != "add_rmsnorm_fwd")
    assert spec.valid(problem, staged) is spec.staged_splits
    if not spec.staged_splits:
        return
    assert MAX_STAGED_BYTES_PER_SM == 4 * 4 * 4096 * 2
    assert not spec.valid(spec.problem(4096, 65536, "float32"), staged)  # 4-byte x: twice
    assert spec.valid(problem, staged.replace(BLOCK_N=8192, num_warps=8, GRID_MULT=2))
    assert spec.valid(problem, staged.replace(BLOCK_N=2048, num_warps=2, GRID_MULT=8))
    assert not spec.valid(problem, staged.replace(BLOCK_N=8192, num_warps=8))
    assert spec.valid(problem, staged.replace(num_stages=5))
    assert not spec.valid(problem, staged.replace(num_stages=6))
    assert spec.valid(problem, staged.replace(BLOCK_N=8192, num_warps=8, num_stages=3))
    assert not spec.valid(problem, staged.replace(ROWS=2, num_stages=2, GRID_MULT=1))
    assert spec.default(problem).num_stages == spec.long_row_split[4] > 1
    assert any(c.num_stages > 1 for c in spec.candidates(problem))
    block, _, _, per_sm, stages = spec.long_row_split
    fp32 = spec.default(spec.problem(4096, 65536, "float32"))  # staged where its stages fit
    assert fp32.COOP
    assert (fp32.num_stages > 1) is (per_sm * (stages - 1) * block * 4
                                     <= MAX_STAGED_BYTES_PER_SM)


def test_a_gpu_with_less_shared_memory_takes_fewer_stages(monkeypatch) -> None:
    """On SMs of 100 KiB (an L4, an RTX 4090) the stages may take 68 KiB beside the programs'
    scratch: four programs of 4K bf16 chunks at four stages (96 KiB) are not valid there, and
    the default (six programs of 4K at three stages, 96 KiB) splits unstaged; without a GPU, or
    on a larger one, the budget is MAX_STAGED_BYTES_PER_SM."""
    spec = REGISTRY["rmsnorm_quant_fwd"]
    problem = spec.problem(4096, 65536)
    staged = spec.default(problem).replace(BLOCK_N=4096, num_warps=4, GRID_MULT=4,
                                           num_stages=4)
    assert staged_bytes_per_sm() == MAX_STAGED_BYTES_PER_SM  # no GPU here
    assert spec.valid(problem, staged)
    monkeypatch.setattr(rmsnorm_fwd_spec, "shared_memory_per_sm", lambda: 228 * 1024)
    assert staged_bytes_per_sm() == MAX_STAGED_BYTES_PER_SM
    monkeypatch.setattr(rmsnorm_fwd_spec, "shared_memory_per_sm", lambda: 100 * 1024)
    assert staged_bytes_per_sm() == 68 * 1024
    assert not spec.valid(problem, staged)
    assert spec.valid(problem, staged.replace(GRID_MULT=2))  # 48 KiB
    default = spec.default(problem)
    assert default.COOP and default.num_stages == 1


@pytest.mark.parametrize("kernel", ["rmsnorm_fwd", "rmsnorm_quant_fwd"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_split_of_one_row_returns_what_a_split_of_two_does(kernel: str, dtype: str,
                                                              device: str) -> None:
    """A split of one row a block (its partials reduced to scalars, `_coop_row`), unstaged and
    with 2-4 stages, one program per SM or several (twelve of one warp), rows dealt unevenly
    over the lanes: the outputs of the split of two rows a block (the gather's tile, the
    register prefetch), bit for bit, within the reference's bounds. (The interpreter runs the
    steps apart; compiled for sm_90 the staged row loop loads ahead: below.)"""
    spec = REGISTRY[kernel]
    problem = spec.problem(11, 2048, dtype, **({"quant": "fp8"} if "quant" in kernel else {}))
    inputs = spec.make_inputs(problem, 3, device)
    two_rows = spec.default(problem).replace(COOP=True, SINGLE=False, BLOCK_N=512, ROWS=2,
                                             num_warps=2, num_stages=1, EVICT=True,
                                             GRID_MULT=1)
    assert spec.valid(problem, two_rows)
    expected = spec.run(inputs, two_rows)
    assert spec.check(inputs, expected) is None
    for per_sm, stages, warps in [(1, 1, 2), (1, 2, 2), (2, 3, 2), (1, 4, 2), (8, 3, 2),
                                  (12, 3, 1)]:
        config = two_rows.replace(ROWS=1, GRID_MULT=per_sm, num_stages=stages,
                                  num_warps=warps)
        assert spec.valid(problem, config), config
        for got, want in zip(spec.run(inputs, config), expected, strict=True):
            assert torch.equal(got, want), config


_STAGED_SPLITS_SASS = """
import sys
sys.path.insert(0, sys.argv[1])
from sass_mix import hopper_cubin, _cubin_tool
from kerneltune.kernels.rmsnorm_fwd import _rmsnorm_fwd_coop_kernel
from kerneltune.kernels.rmsnorm_quant import _rmsnorm_quant_coop_kernel
fwd = {"PART": "*fp32", "NQ": "i32", "X": "*bf16", "W": "*bf16", "Y": "*bf16", "RSTD": "*fp32",
       "stride_x": "i32", "stride_y": "i32", "M": "i32", "N": "i32", "eps": "fp32",
       "offset": "fp32"}
quant = {"PART_SQ": "*fp32", "PART_MAX": "*fp32", "NQ": "i32", "X": "*bf16", "W": "*bf16",
         "B": "*bf16", "Q": "*i8", "SCALE": "*fp32", "stride_x": "i32", "stride_q": "i32",
         "M": "i32", "N": "i32", "eps": "fp32", "min_scale": "fp32"}
split = {"BLOCK_N": 4096, "NQ_POW2": 32, "PHASE": 0, "EVICT": True}
for rows, stages in [(1, 3), (1, 1), (2, 3)]:
    consts = {**split, "ROWS": rows, "STAGES": stages}
    for fn, sig, more in [(_rmsnorm_fwd_coop_kernel, fwd, {"GEMMA": False}),
                          (_rmsnorm_quant_coop_kernel, quant,
                           {"MODE": 0, "QMAX": 127.0, "HAS_W": True, "HAS_B": False,
                            "SOFT_ROUND": False})]:
        cubin = hopper_cubin(fn, sig, {**consts, **more}, 4, num_stages=stages)
        print(_cubin_tool("nvdisasm", cubin, "-c").count("LDGSTS"))
"""


def test_a_staged_split_loads_its_rows_ahead_on_hopper() -> None:
    """Compiled for sm_90 (offline), the forward's and quant's splits of one row a block with
    three stages copy their next rows into shared memory asynchronously (LDGSTS); with one
    stage, or two rows a block (whose gather's polling loop keeps the pipeliner off), not."""
    counts = [int(v) for v in compiled_offline(_STAGED_SPLITS_SASS).split()]
    assert counts[0] > 0 and counts[1] > 0
    assert counts[2:] == [0, 0, 0, 0]


@pytest.mark.parametrize("kernel", SPLIT_KERNELS)
def test_split_candidates_for_long_rows_only(kernel: str) -> None:
    spec = REGISTRY[kernel]
    long_rows = spec.problem(4096, 65536)
    candidates = spec.candidates(long_rows)
    assert any(c.COOP for c in candidates)
    assert all(spec.valid(long_rows, c) for c in candidates)
    # Beside the splits, only the thin loop of a default that loops over the row.
    default = spec.default(long_rows)
    loops = [] if default.COOP else spec.thin_loop(long_rows, default)
    assert [c for c in candidates if not c.COOP] == loops
    # A row of one chunk: no split (quant's whole row may still run on a persistent grid).
    assert not any(c.COOP for c in spec.candidates(spec.problem(4096, 4096)))


@pytest.mark.parametrize("kernel", SPLIT_KERNELS)
def test_configs_from_before_the_split_did_not_split(kernel: str) -> None:
    spec = REGISTRY[kernel]
    problem = spec.problem(16, 65536)
    before = {k: v for k, v in spec.default(problem).to_json().items() if k != "COOP"}
    assert spec.default(problem).COOP is True
    assert spec.upgrade(problem, {**before, "BLOCK_N": 16384})["COOP"] is False
    assert spec.upgrade(problem, {**before, "COOP": True})["COOP"] is True
    assert spec.parse(problem, {**before, "COOP": True}) == spec.default(problem)
    with pytest.raises(ValueError, match=r"unknown parameters \['GONE'\]"):
        spec.parse(problem, {**before, "GONE": 1})


@pytest.mark.parametrize(("m", "rows", "chunks", "sms", "expected"), [
    (4096, 1, 8, 132, 16),  # as many lanes as fit beside each other
    (3, 1, 8, 132, 3),  # never more than there are row blocks
    (5, 2, 8, 132, 3),
    (4096, 1, 200, 132, 1),  # wider than the GPU: one lane (then run step by step)
])
def test_lanes(m: int, rows: int, chunks: int, sms: int, expected: int) -> None:
    assert _coop.lanes(m, rows, chunks, sms) == expected


def test_lane_count_takes_grid_mult_programs_per_sm() -> None:
    """Without a GPU the grid counts `INTERPRETER_SMS` (4) SMs."""
    x = torch.empty(37, 4096)
    # 4 chunks a row; GRID_MULT left at what configs from before it ran: one per SM.
    split = RowTilingConfig(BLOCK_N=1024, SINGLE=False, ROWS=1, EVICT=True, num_warps=4,
                            num_stages=1, COOP=True)
    assert _coop.lane_count(x, split) == 1
    assert _coop.lane_count(x, split.replace(GRID_MULT=3)) == 3
    assert _coop.lane_count(x[:2], split.replace(GRID_MULT=3)) == 2  # one lane a row block


@pytest.mark.parametrize(("per_sm", "warps"), [(1, 4), (1, 16), (2, 4), (2, 8), (3, 4), (3, 8),
                                               (4, 4), (4, 8), (2, 16), (12, 1), (12, 2)])
def test_resident_options_let_grid_mult_programs_share_an_sm(per_sm: int, warps: int) -> None:
    """The register cap is a multiple of the allocation granule (8) that fits GRID_MULT
    programs in an SM's 64K registers; none where they fit anyway (255 at most a thread, taken
    as 256), nor for one program (the compiler fits it to its block)."""
    options = _coop.resident_options(RowTilingConfig(
        BLOCK_N=2048, SINGLE=False, ROWS=1, EVICT=True, num_warps=warps, num_stages=1,
        COOP=True, GRID_MULT=per_sm))
    if per_sm == 1:
        assert options == {}
        return
    cap = options.get("maxnreg", 256)
    assert cap % 8 == 0
    assert per_sm * warps * 32 * cap <= _coop.REGS_PER_SM


#: The forward's split kernel, typed for an offline compile (`_offline`).
_FORWARD_SPLIT = """
import sys
sys.path.insert(0, sys.argv[1])
from sass_mix import hopper_registers, hopper_sass
from kerneltune.kernels import ForwardConfig
from kerneltune.kernels._coop import resident_options
from kerneltune.kernels.rmsnorm_fwd import _rmsnorm_fwd_coop_kernel
sig = {"PART": "*fp32", "NQ": "i32", "X": "*bf16", "W": "*bf16", "Y": "*bf16", "RSTD": "*fp32",
       "stride_x": "i32", "stride_y": "i32", "M": "i32", "N": "i32", "eps": "fp32",
       "offset": "fp32"}
"""
_CAPPED_FORWARD_REGISTERS = _FORWARD_SPLIT + """
consts = {"BLOCK_N": 8192, "ROWS": 2, "NQ_POW2": 32, "PHASE": 0, "GEMMA": False, "EVICT": True,
          "STAGES": 1}
for per_sm in (1, 2):
    config = ForwardConfig(BLOCK_N=8192, SINGLE=False, ROWS=2, EVICT=True, num_warps=8,
                           num_stages=1, COOP=True, GRID_MULT=per_sm)
    print(hopper_registers(_rmsnorm_fwd_coop_kernel, sig, consts, 8,
                           **resident_options(config)))
"""


def test_two_programs_of_a_split_fit_an_sm_on_hopper() -> None:
    """The forward's split at 8K chunks of two rows and 8 warps (the block after next held in
    registers), compiled for sm_90 (offline), takes more than half an SM's registers alone and
    at most half with GRID_MULT = 2."""
    alone, capped = (int(v) for v in compiled_offline(_CAPPED_FORWARD_REGISTERS).split())
    assert alone * 8 * 32 > _coop.REGS_PER_SM // 2
    assert capped * 8 * 32 <= _coop.REGS_PER_SM // 2


def test_one_waiting_launch_only_where_the_lane_is_resident(monkeypatch) -> None:
    monkeypatch.setattr(_coop, "interpreting", lambda: False)
    assert _coop.phases(chunks=8, sms=132, steps=2) == (0,)
    assert _coop.phases(chunks=133, sms=132, steps=2) == (1, 2, 3)
    assert _coop.phases(chunks=133, sms=132, steps=1) == (1, 2)
    monkeypatch.setattr(_coop, "interpreting", lambda: True)  # programs run one after another
    assert _coop.phases(chunks=8, sms=132, steps=2) == (1, 2, 3)


def test_the_dependent_fill_unsets_its_slots_and_nothing_past_them(device: str) -> None:
    """`_coop_dependent.fill_unset` over a buffer that held other values (a new allocation
    may hold a previous call's partials): every slot of its size, across programs, and not
    one beyond."""
    size = 2 * _coop_dependent.FILL_BLOCK + 5
    parts = torch.arange(size + 7, dtype=torch.float32, device=device)
    _coop_dependent.fill_unset[(triton.cdiv(size, _coop_dependent.FILL_BLOCK),)](
        parts, size, BLOCK=_coop_dependent.FILL_BLOCK, PDL=False)
    assert torch.equal(parts[:size].cpu(), torch.full((size,), _coop.UNSET.value))
    assert torch.equal(parts[size:].cpu(), torch.arange(size, size + 7, dtype=torch.float32))


_DEPENDENT_FILL_SASS = """
import sys
sys.path.insert(0, sys.argv[1])
from sass_mix import hopper_sass, opcodes
from kerneltune.kernels._coop_dependent import FILL_BLOCK, fill_unset
for pdl in (True, False):
    sass = hopper_sass(fill_unset, {"PARTS": "*fp32", "size": "i32"},
                       {"BLOCK": FILL_BLOCK, "PDL": pdl}, 4)
    print(*opcodes(sass))
"""


def test_dependent_launches_give_each_agreement_its_buffers_of_values() -> None:
    """`_coop_dependent.launches` allocates steps · values partial buffers (all filled by one
    launch, then passed to the kernel ahead of Q), and launches the kernel once per phase of
    its `steps` agreements, whatever `values`; by default one value an agreement."""
    x = torch.empty(5, 1000, device="meta")
    config = BackwardConfig(BLOCK_N=256, SINGLE=False, DW="split", ROWS=1, GRID_MULT=1,
                            EVICT=False, num_warps=1, num_stages=1)
    for steps, values in ((1, None), (1, 2), (2, 3)):
        more = {} if values is None else {"values": values}
        parts, (fill, *split) = _coop_dependent.launches("kernel", x, config, steps, "arg",
                                                          pdl=False, **more)
        assert parts.shape == (steps * (values or 1), 5, 4)
        assert fill.kernel is _coop_dependent.fill_unset and fill.args[1] == parts.numel()
        assert [launch.meta["PHASE"] for launch in split] == list(_coop.phases(
            4, sm_count(x.device), steps))
        assert all(launch.args[len(parts):] == (4, "arg") for launch in split)
        assert "values" not in split[0].meta


def test_the_dependent_fill_waits_then_releases_before_it_stores_on_hopper() -> None:
    """Compiled for sm_90 (offline) with PDL, the fill waits for the grid before it (ACQBULK)
    before it releases the split (PREEXIT), and both come before its first store: the split
    is placed at once, and the slots are not written while an earlier grid may use them."""
    lines = compiled_offline(_DEPENDENT_FILL_SASS).splitlines()
    with_pdl, without = (line.split() for line in lines)
    assert with_pdl.count("ACQBULK") == 1 and with_pdl.count("PREEXIT") == 1
    assert with_pdl.index("ACQBULK") < with_pdl.index("PREEXIT") < with_pdl.index("STG")
    assert "ACQBULK" not in without and "PREEXIT" not in without and "STG" in without


#: The shared device code each kernel's module calls.
CALLS = {
    rmsnorm_quant: {_coop, _coop_pair, _coop_row, _dependent_launch},
    rmsnorm_fwd: {_coop, _coop_norm, _coop_pair, _coop_row, _dependent_launch},
    add_rmsnorm: {_coop, _coop_norm, _dependent_launch},
    rmsnorm_bwd: {_coop, _coop_dependent, _dependent_launch},
    layernorm: {_dependent_launch},  # the forward
    # The backward (its whole rows' kernels in layernorm, and rmsnorm_bwd's reduction).
    layernorm_bwd: {_coop, _coop_dependent, _coop_pair, _dependent_launch},
    rmsnorm_group_quant: {_dependent_launch},  # and rmsnorm_quant's scales and rounding
}


def test_the_hash_covers_the_shared_device_code_a_kernel_calls(monkeypatch) -> None:
    """An edit to `_coop` makes the splitting kernels' tuned entries stale, the backward's
    row split's included (and an edit to `_dependent_launch` every kernel's): an edit to the
    Triton functions of a shared module changes the hash of each kernel that calls it, and of
    no other."""
    assert {spec.module for spec in REGISTRY.values()} == set(CALLS)
    before = {spec.module: spec.kernel_hash for spec in REGISTRY.values()}
    original = _spec.jit_source
    for shared in (_coop, _coop_dependent, _coop_norm, _coop_pair, _coop_row,
                   _dependent_launch):

        def edited(fn, module, shared=shared):
            return original(fn, module) + ("\n# edited" if module is shared else "")

        monkeypatch.setattr(_spec, "jit_source", edited)
        monkeypatch.setattr(_spec, "_HASHES", {})
        stale = {s.module for s in REGISTRY.values() if s.kernel_hash != before[s.module]}
        assert stale == {m for m, calls in CALLS.items() if shared in calls}, shared.__name__


@triton.jit
def _publish_then_gather(PART, OUT, M, NQ, ROWS: tl.constexpr, NQ_POW2: tl.constexpr,
                         WAIT: tl.constexpr):
    """Program rb publishes chunk q's partials q + rows / 8 for every chunk of its row block,
    then gathers them (by then all published, so a WAIT returns at once)."""
    rb = tl.program_id(0)
    rows = rb * ROWS + tl.arange(0, ROWS)
    for q in range(0, NQ):
        publish(PART, rb, q, NQ, M, q + rows.to(tl.float32) / 8.0, ROWS)
    parts = gather(PART, rows, rows < M, NQ, NQ_POW2, WAIT)
    qs = tl.arange(0, NQ_POW2)
    tl.store(OUT + rows[:, None] * NQ_POW2 + qs[None, :], parts, mask=(rows < M)[:, None])


def test_partials_are_gathered_as_published(device: str) -> None:
    """A partial goes out as its own bits (an int32 exchange) and comes back exactly; slots
    past Q and rows past M read 0, and rows past M are never written. On a GPU through the
    waiting read; the interpreter runs no PTX, and reads plainly. (The plain read is for
    launches whose partials were all published before them: compiled, reading slots that
    other threads publish meanwhile hung this test.)"""
    m, chunks, rows = 5, 3, 2
    # One row past M, to see it untouched.
    part = torch.full((m + 1, chunks), _coop.UNSET.value, device=device)
    out = torch.full((m, 4), float("nan"), device=device)
    _publish_then_gather[(triton.cdiv(m, rows),)](part, out, m, chunks, ROWS=rows, NQ_POW2=4,
                                                  WAIT=device == "cuda")
    part, out = part.cpu(), out.cpu()
    expected = torch.arange(chunks) + torch.arange(m)[:, None] / 8.0
    assert torch.equal(part[:m], expected)
    assert torch.equal(part[m], torch.full((chunks,), _coop.UNSET.value))
    assert torch.equal(out[:, :chunks], expected) and torch.equal(out[:, chunks:],
                                                                  torch.zeros(m, 1))


@triton.jit
def _gather_two_blocks(A, B, OUT_A, OUT_B, M, NQ, ROWS: tl.constexpr, NQ_POW2: tl.constexpr,
                       WAIT: tl.constexpr):
    """Program rb publishes its row block's partials into A and B (B's 100 more), then gathers
    A's of its own block and B's of the block before (none before the first)."""
    rb = tl.program_id(0)
    rows = rb * ROWS + tl.arange(0, ROWS)
    for q in range(0, NQ):
        value = q + rows.to(tl.float32) / 8.0
        publish(A, rb, q, NQ, M, value, ROWS)
        publish(B, rb, q, NQ, M, value + 100.0, ROWS)
    prev = rows - ROWS
    a, b = gather_pair(A, rows, rows < M, B, prev, prev >= 0, NQ, NQ_POW2, WAIT)
    qs = tl.arange(0, NQ_POW2)
    out = rows[:, None] * NQ_POW2 + qs[None, :]
    tl.store(OUT_A + out, a, mask=(rows < M)[:, None])
    tl.store(OUT_B + out, b, mask=(rows < M)[:, None])


def test_a_pair_of_agreements_is_gathered_as_published(device: str) -> None:
    """Each of the two tiles comes back as published for its own rows, B's by the program
    before (on a GPU waited for, as it runs beside it); slots past Q, and the rows of the block
    before the first, read 0."""
    m, chunks, rows = 5, 3, 2
    a, b = (torch.full((m, chunks), _coop.UNSET.value, device=device) for _ in range(2))
    out_a, out_b = (torch.full((m, 4), float("nan"), device=device) for _ in range(2))
    _gather_two_blocks[(triton.cdiv(m, rows),)](a, b, out_a, out_b, m, chunks, ROWS=rows,
                                                NQ_POW2=4, WAIT=device == "cuda")
    out_a, out_b = out_a.cpu(), out_b.cpu()
    expected = torch.arange(chunks) + torch.arange(m)[:, None] / 8.0
    assert torch.equal(out_a[:, :chunks], expected)
    assert torch.equal(out_b[:rows], torch.zeros(rows, 4))
    assert torch.equal(out_b[rows:, :chunks], expected[: m - rows] + 100.0)
    assert torch.equal(out_a[:, chunks:], torch.zeros(m, 1))
    assert torch.equal(out_b[:, chunks:], torch.zeros(m, 1))


#: Quant's split kernel, typed for an offline compile (`_offline`).
_QUANT_SPLIT = """
import sys
sys.path.insert(0, sys.argv[1])
from sass_mix import hopper_sass, opcodes
from kerneltune.kernels import QuantConfig
from kerneltune.kernels._coop import resident_options
from kerneltune.kernels.rmsnorm_quant import _rmsnorm_quant_coop_kernel
sig = {"PART_SQ": "*fp32", "PART_MAX": "*fp32", "NQ": "i32", "X": "*bf16", "W": "*bf16",
       "B": "*bf16", "Q": "*i8", "SCALE": "*fp32", "stride_x": "i32", "stride_q": "i32",
       "M": "i32", "N": "i32", "eps": "fp32", "min_scale": "fp32"}
"""
_WAITING_QUANT_SASS = _QUANT_SPLIT + """
consts = {"BLOCK_N": 4096, "ROWS": 1, "NQ_POW2": 16, "PHASE": 0, "EVICT": True, "MODE": 0,
          "QMAX": 127.0, "HAS_W": True, "HAS_B": False, "SOFT_ROUND": False, "STAGES": 1}
sys.stdout.write(hopper_sass(_rmsnorm_quant_coop_kernel, sig, consts, warps=4))
"""


def test_quant_waits_for_its_two_agreements_at_once_on_hopper() -> None:
    """Compiled for sm_90 (offline), quant's split reads the sums of squares and the maxima
    it waits for in a step both before it compares either with UNSET (-1.0f, 0xBF800000)."""
    sass = [line for line in compiled_offline(_WAITING_QUANT_SASS).splitlines()
            if re.search(r"/\*[0-9a-f]{4}\*/", line)]
    polls = [i for i, line in enumerate(sass) if re.search(r"LDG\.E\.STRONG\.GPU ", line)]
    first_check = next(i for i, line in enumerate(sass) if "-0x40800000" in line)
    assert len([i for i in polls if i < first_check]) == 2


_RESIDENT_QUANT_SASS = _QUANT_SPLIT + """
six = QuantConfig(BLOCK_N=4096, SINGLE=False, ROWS=1, EVICT=True, num_warps=2, num_stages=3,
                  COOP=True, GRID_MULT=6)
for mode, qtype, qmax in ((0, "*i8", 127.0), (1, "*fp8e4nv", 448.0)):
    consts = {"BLOCK_N": 4096, "ROWS": 1, "NQ_POW2": 64, "PHASE": 0, "EVICT": True, "MODE": mode,
              "QMAX": qmax, "HAS_W": True, "HAS_B": False, "SOFT_ROUND": False, "STAGES": 3}
    ops = opcodes(hopper_sass(_rmsnorm_quant_coop_kernel, {**sig, "Q": qtype}, consts, 2,
                              num_stages=3,
                              **resident_options(six)))
    print(ops.count("STL"), ops.count("LDL"))
"""


def test_six_quant_programs_an_sm_hold_64_elements_a_thread_without_spilling() -> None:
    """Quant's split of one row a block at 24K elements an SM (six programs of 4K chunks at
    two warps, three stages), compiled for sm_90 (offline) under the register cap that lets
    six reside: int8 and fp8 store and reload nothing from local memory. (Its step stores the
    row before first, so a thread holds one row's y at a time; `../quant-store-first/`.)"""
    assert compiled_offline(_RESIDENT_QUANT_SASS).split() == ["0"] * 4


@triton.jit
def _widened(X, Y, BY_ASM: tl.constexpr):
    c = tl.arange(0, 1024)
    x = tl.load(X + c)
    y = _widen(x, False) if BY_ASM else x.to(tl.float32)
    tl.store(Y + c, y)


_WIDENING_SASS = f"""
import sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, {str(Path(__file__).parent)!r})
from sass_mix import hopper_sass
from test_coop import _widened
for by_asm in (True, False):
    print(hopper_sass(_widened, {{"X": "*bf16", "Y": "*fp32"}}, {{"BY_ASM": by_asm}}, warps=4))
    print("=====")
"""


def test_the_split_widens_bf16_with_one_integer_op_a_value_on_hopper() -> None:
    """Compiled for sm_90 (offline), `_widen` unpacks a thread's 8 bf16 (4 registers) with 4
    shifts and 4 masks; `.to(tl.float32)` takes 8 shifts and a PRMT for each high half."""
    by_asm, by_to = compiled_offline(_WIDENING_SASS).split("=====")[:2]
    shift = r"IMAD\.U32 R\d+, R\d+(\.reuse)?, 0x10000,"  # x << 16
    mask = r"LOP3\.LUT R\d+, R\d+, 0xffff0000,"  # x & 0xffff0000
    assert len(re.findall(shift, by_asm)) == 4 and len(re.findall(mask, by_asm)) == 4
    assert "PRMT" not in by_asm
    assert len(re.findall(shift, by_to)) == 8 and len(re.findall(r"\bPRMT\b", by_to)) == 4


_WAITING_FORWARD_SASS = _FORWARD_SPLIT + """
consts = {"BLOCK_N": 1024, "ROWS": 4, "NQ_POW2": 128, "PHASE": 0, "GEMMA": False, "EVICT": True,
          "STAGES": 1}
sys.stdout.write(hopper_sass(_rmsnorm_fwd_coop_kernel, sig, consts, warps=4))
"""


def test_a_waiting_gather_polls_each_slot_copy_on_hopper() -> None:
    """The waiting read's PTX assembles for sm_90 (offline), and each thread polls every slot
    copy it holds: 4 rows x 128 slots over 128 threads is 4 polling loads per thread, once
    before the gather's loop and once in it."""
    sass = compiled_offline(_WAITING_FORWARD_SASS)
    assert len(re.findall(r"LDG\.E\.STRONG\.GPU ", sass)) == 2 * 4
    assert "ATOMG.E.EXCH.STRONG.GPU" in sass  # the publishing exchange


@pytest.mark.parametrize("kernel", [*SPLIT_KERNELS, *BACKWARD_SPLITS])
def test_more_programs_per_sm_deal_the_rows_to_more_lanes_alike(kernel: str,
                                                                 device: str) -> None:
    """GRID_MULT = 4 gives the split four times the lanes (over 2 chunks, half the SMs against
    twice them: 2 against 8 of 13 row blocks on the interpreter's 4 SMs), each taking fewer
    blocks, and the same outputs: the same values for every row (dw, summed over lanes, within
    the fp32 rounding of a sum over M rows)."""
    spec = REGISTRY[kernel]
    sms = sm_count(device)
    problem = spec.problem(3 * sms + 1, 1024, "float32")
    inputs = spec.make_inputs(problem, 0, device)
    backward = kernel in BACKWARD_SPLITS
    mode = {"DW": "split", "PREFETCH": False} if backward else {"COOP": True}
    split = spec.default(problem).replace(**mode, SINGLE=False, BLOCK_N=512, ROWS=1,
                                          num_warps=2, num_stages=1, GRID_MULT=1)
    spread = split.replace(GRID_MULT=4)
    assert spec.valid(problem, split) and spec.valid(problem, spread)
    x = inputs["x"]
    assert (_coop.lane_count(x, split), _coop.lane_count(x, spread)) == (sms // 2, 2 * sms)
    one, four = spec.run(inputs, split), spec.run(inputs, spread)
    assert spec.check(inputs, four) is None
    assert torch.equal(one[0], four[0])
    summed = problem.m * 2.0**-24  # dw (and db): sums over M rows, grouped by lane
    for a, b in zip(one[1:], four[1:], strict=True):
        assert torch.allclose(a, b, rtol=summed, atol=summed) if backward else torch.equal(a, b)


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")  # the interpreter's max
@pytest.mark.parametrize("kernel", SPLIT_KERNELS)
def test_a_nan_row_leaves_the_others_alone(kernel: str, device: str) -> None:
    """A NaN row's partials are NaN (a waiting gather polls for UNSET alone, so it ends); the
    other rows come out as they did without it (on a GPU in one waiting launch, under the
    interpreter step by step)."""
    spec = REGISTRY[kernel]
    problem = spec.problem(3, 2048, "float32")
    inputs = spec.make_inputs(problem, 0, device)
    split = spec.default(problem).replace(COOP=True, SINGLE=False, BLOCK_N=512, num_warps=2,
                                          num_stages=1)
    assert spec.valid(problem, split)
    clean = spec.run(inputs, split)
    inputs["x"][1, 5] = float("nan")
    for before, after in zip(clean, spec.run(inputs, split), strict=True):
        assert torch.equal(before[[0, 2]], after[[0, 2]])
