"""The contract every kernel of the family follows, and what the kernels share.

A :class:`KernelSpec` knows, for a :class:`Problem`, its search space, the constraints on it,
the heuristic default, how to make inputs, run the Triton kernel with a config, compute the
plain-torch reference, check an output against it, and how many bytes the kernel must move.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import io
import itertools
import math
import sys
import textwrap
import tokenize
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, ClassVar

import torch

from kerneltune.kernels._config import KernelConfig
from kerneltune.table import DTYPES, ConfigValue

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}

Inputs = dict[str, Any]
Outputs = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class Problem:
    """One problem instance: kernel, M rows, hidden size N, dtype and the kernel's options."""

    kernel: str
    m: int
    n: int
    dtype: str = "bfloat16"
    options: tuple[tuple[str, ConfigValue], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.m < 1 or self.n < 1:
            raise ValueError(f"M and N must be >= 1, got M={self.m}, N={self.n}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        object.__setattr__(self, "options", tuple(sorted(dict(self.options).items())))

    @classmethod
    def of(cls, kernel: str, m: int, n: int, dtype: str = "bfloat16", **options: ConfigValue
           ) -> Problem:
        return cls(kernel, m, n, dtype, tuple(options.items()))

    def option(self, name: str, default: ConfigValue) -> ConfigValue:
        return dict(self.options).get(name, default)

    @property
    def torch_dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.dtype]

    @property
    def itemsize(self) -> int:
        return self.torch_dtype.itemsize


def generator(seed: int, device: str | torch.device) -> torch.Generator:
    """A seeded generator on `device`: inputs are drawn where they are used (drawing a large
    problem's inputs on the host and copying them takes seconds; on the GPU, milliseconds)."""
    return torch.Generator(device=torch.device(device)).manual_seed(seed)


def normal(g: torch.Generator, *shape: int, dtype: torch.dtype, mean: float = 0.0,
           std: float = 1.0) -> torch.Tensor:
    """mean + std · N(0, 1) drawn in fp32 by `g` on its device, rounded to `dtype`."""
    return (mean + std * torch.randn(*shape, generator=g, device=g.device)).to(dtype)


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def pow2_range(lo: int, hi: int) -> list[int]:
    """Powers of two from lo to hi inclusive."""
    out, v = [], next_pow2(lo)
    while v <= hi:
        out.append(v)
        v *= 2
    return out


#: Largest number of elements one program keeps in registers at once (per row block); beyond
#: it the compiler spills, so larger blocks are pruned from the space rather than tried.
MAX_BLOCK_ELEMS = 16384
#: Smallest chunk a looped config takes: shorter chunks only add loop iterations.
MIN_LOOP_BLOCK = 512
#: Fewest elements a thread of a multi-warp program works on: one 16-byte vector of 16-bit
#: values (fewer leaves lanes idle or loads narrower than the hardware's widest).
MIN_ELEMS_PER_THREAD = 8
NUM_WARPS = (1, 2, 4, 8, 16, 32)
NUM_STAGES = (1, 2, 3, 4)


class KernelSpec(ABC):
    """A tunable kernel of the family. Subclasses are stateless singletons in the registry."""

    name: str
    #: Options a problem may carry, with their allowed values (first is the default).
    options: ClassVar[Mapping[str, Sequence[ConfigValue]]] = {}

    #: The kernel's typed config: its fields are the space's parameters.
    config_type: ClassVar[type[KernelConfig]]

    # -- search space --------------------------------------------------------------------
    @abstractmethod
    def space(self, problem: Problem) -> dict[str, list[ConfigValue]]:
        """Each tunable parameter with its choices (constraints apply on top, see `valid`)."""

    @abstractmethod
    def valid(self, problem: Problem, config: KernelConfig) -> bool:
        """Whether a config of the space may run on this problem (fits, compiles, is not
        pointless): the constraints on top of the space."""

    @abstractmethod
    def default(self, problem: Problem) -> KernelConfig:
        """The heuristic config used when nothing is tuned."""

    def candidates(self, problem: Problem) -> list[KernelConfig]:
        """Configs measured strong elsewhere that a search should try early, after the default
        and the neighbours' winners (a few trials may not sample them); none unless a kernel
        names some."""
        return []

    def valid_variants(self, problem: Problem, base: KernelConfig, names: Sequence[str],
                       values: Sequence[Sequence[Any]]) -> list[KernelConfig]:
        """`base` with each row of `values` set on `names`, those valid for the problem (a
        kernel's `candidates`)."""
        variants = (base.replace(**dict(zip(names, row, strict=True))) for row in values)
        return [c for c in variants if self.valid(problem, c)]

    def configs(self, problem: Problem) -> Iterator[KernelConfig]:
        """Every valid config of the space, in a fixed order (brute force, tests)."""
        space = self.space(problem)
        names = list(space)
        for values in itertools.product(*(space[k] for k in names)):
            config = self.config_type(**dict(zip(names, values, strict=True)))
            if self.valid(problem, config):
                yield config

    def rejects(self, problem: Problem, config: KernelConfig) -> str | None:
        """Why a config may not run on this problem (None if it may): a parameter whose value
        is not one of the space's choices, of exactly its type, or the constraints."""
        space = self.space(problem)
        for name, value in config.items():
            if not any(type(value) is type(c) and value == c for c in space[name]):
                return f"{name}={value!r} is not one of {space[name]}"
        if not self.valid(problem, config):
            return f"the config does not fit {problem.m} x {problem.n} {problem.dtype}"
        return None

    def parse(self, problem: Problem, data: Mapping[str, Any]) -> KernelConfig:
        """The config a table's JSON gives for this problem, older entries upgraded
        (`upgrade`); ValueError, saying why, for anything that may not run on it."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{self.name}: a config is a JSON object, got {type(data).__name__}")
        config = self.config_type.from_json(self.upgrade(problem, data))
        why = self.rejects(problem, config)
        if why:
            raise ValueError(f"{self.name}: {why}")
        return config

    def upgrade(self, problem: Problem, data: Mapping[str, Any]) -> dict[str, Any]:
        """A config stored by earlier code of the kernel, as this code reads it: the
        parameters added since take the value those entries ran with
        (`KernelConfig.added_since`); a kernel whose older configs need more says so."""
        return {**self.config_type.added_since(), **data}

    # -- running ---------------------------------------------------------------------------
    @abstractmethod
    def make_inputs(self, problem: Problem, seed: int, device: str | torch.device) -> Inputs:
        """Fresh random inputs (never zeros) for the problem."""

    @abstractmethod
    def run(self, inputs: Inputs, config: KernelConfig) -> Outputs:
        """Run the Triton kernel with a config."""

    @abstractmethod
    def reference(self, inputs: Inputs) -> Outputs:
        """The plain-torch ground truth, same outputs and dtypes as `run`."""

    @abstractmethod
    def bytes_moved(self, problem: Problem) -> int:
        """Fewest bytes through device memory: each input read once, each output written once."""

    #: The inputs indexed by row (first dimension M): the reference of a block of rows is
    #: the reference of these inputs' rows, the others whole (`rows_of`). Where the outputs are
    #: all indexed by row too, the check takes the reference a block at a time (`check_by_rows`).
    row_inputs: ClassVar[tuple[str, ...]] = ()
    #: The outputs that sum over the rows rather than being indexed by them (the backward's
    #: dw): a block of rows' reference holds that block's share of each.
    summed_outputs: ClassVar[tuple[int, ...]] = ()

    def check(
        self, inputs: Inputs, outputs: Outputs, expected: Outputs | None = None
    ) -> str | None:
        """None when `outputs` match the reference (`expected`, where given) within the dtype's
        tolerance, else why not."""
        if expected is None and self.row_inputs and not self.summed_outputs:
            return check_by_rows(self.reference, self.row_inputs, inputs, outputs)
        expected = self.reference(inputs) if expected is None else expected
        return compare_outputs(outputs, expected)

    # -- identity --------------------------------------------------------------------------
    #: The module of the kernel's device code (its Triton kernels and their launcher) when it is
    #: not the spec's own: the reference, the check, the space and the default may then change
    #: without making tuned tables stale.
    kernel_module: ClassVar[ModuleType | None] = None

    @property
    def module(self) -> ModuleType:
        """The module holding the kernel's device code."""
        return self.kernel_module or sys.modules[type(self).__module__]

    @property
    def kernel_hash(self) -> str:
        """Hash of the kernel's device code (`device_code_hash`): a table entry with another
        hash is stale."""
        return device_code_hash(self.module)

    def problem(self, m: int, n: int, dtype: str = "bfloat16", **options: ConfigValue) -> Problem:
        return Problem.of(self.name, m, n, dtype, **options)

    def served(self, problem: Problem) -> list[Problem]:
        """The problems a tuned entry for `problem`'s key answers, each of which its search
        checks and times (the key's time is their mean): the problem itself, unless a kernel's
        options change its cost and its key has none."""
        return [problem]


_HASHES: dict[str, str] = {}


def device_code_hash(module: ModuleType) -> str:
    """Hash of what a kernel module makes the GPU run: the source of its `@triton.jit`
    functions and of those in the modules it names in `DEVICE_CODE_FROM` (shared Triton
    functions it calls), the module constants they read, and its `LAUNCH_VERSION` (bumped
    whenever the launcher changes a grid, an argument, a constexpr or a launch option).

    Comments, docstrings, blank lines and everything outside the Triton functions (host code,
    module docs) are left out, so a refactor that keeps the device code keeps tuned tables
    current. The text hashed is the source as written, not an AST dump, so that every Python
    version hashes it alike."""
    h = _HASHES.get(module.__name__)
    if h is None:
        parts = [f"launch {getattr(module, 'LAUNCH_VERSION', 0)}"]
        for m in (module, *getattr(module, "DEVICE_CODE_FROM", ())):
            parts += [jit_source(fn, m) for fn in jit_functions(m)]
        h = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
        _HASHES[module.__name__] = h
    return h


def jit_functions(module: ModuleType) -> list[Any]:
    """The Triton functions defined in `module` (not those it imports), by name."""
    from triton.runtime.jit import KernelInterface

    return [value for name, value in sorted(vars(module).items())
            if isinstance(value, KernelInterface) and value.fn.__module__ == module.__name__
            and value.fn.__name__ == name]


def jit_source(jit: Any, module: ModuleType) -> str:
    """A Triton function's source without comments, docstring and blank lines, followed by the
    value of each module constant it names (a change of one changes what is compiled)."""
    source = textwrap.dedent(inspect.getsource(jit.fn))
    lines = source.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            lines[row - 1] = lines[row - 1][:col]
    tree = ast.parse(source)
    func = tree.body[0]
    if (func.body and isinstance(func.body[0], ast.Expr)
            and isinstance(func.body[0].value, ast.Constant)
            and isinstance(func.body[0].value.value, str)):
        doc = func.body[0]
        for row in range(doc.lineno, (doc.end_lineno or doc.lineno) + 1):
            lines[row - 1] = ""
    code = [line.rstrip() for line in lines if line.strip()]
    names = sorted({n.id for n in ast.walk(func) if isinstance(n, ast.Name)})
    constants = [f"{name} = {vars(module)[name]!r}" for name in names
                 if isinstance(vars(module).get(name), int | float | str)]
    return "\n".join(code + constants)


# ------------------------------------------------------------------------------ checking

#: Unit roundoff of each dtype (half an ulp at 1.0).
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


#: Elements compared at a time: a check holds several float64 copies of what it compares, and
#: all of a 16384 x 131072 problem at once would need more memory than an 80 GB GPU has.
CHECK_ELEMS = 1 << 24


def row_blocks(m: int, row: int) -> list[slice]:
    """Slices of M rows of `row` elements each, about `CHECK_ELEMS` elements a slice: how a
    check (and a float64 reference) takes a large problem a part at a time."""
    step = max(1, CHECK_ELEMS // max(1, row))
    return [slice(start, start + step) for start in range(0, m, step)]


def rows_of(inputs: Inputs, row_inputs: Sequence[str], rows: slice) -> Inputs:
    """The inputs of a block of rows: `row_inputs` sliced (views), the others whole."""
    return {k: v[rows] if k in row_inputs else v for k, v in inputs.items()}


def rows_named(rows: slice, m: int) -> str:
    """A block of rows as a message names it."""
    return f"rows {rows.start}-{min(rows.stop, m) - 1}"


def reference_peaks(references: Iterable[Outputs]) -> list[float]:
    """The largest magnitude of each floating output over a reference's blocks of rows (0 for
    the others): the floors of `within_one_rounding`, as the whole reference would give them."""
    peaks: list[float] = []
    for block in references:
        peaks += [0.0] * (len(block) - len(peaks))
        for i, r in enumerate(block):
            if r.is_floating_point() and r.numel():
                peaks[i] = max(peaks[i], float(torch.maximum(r.max(), -r.min())))
    return peaks


def check_by_rows(reference: Callable[[Inputs], Outputs], row_inputs: Sequence[str],
                  inputs: Inputs, outputs: Outputs) -> str | None:
    """`compare_outputs` against `reference` taken `row_blocks` at a time, for a kernel whose
    outputs are all indexed by row: no float64 copy of a large problem exists whole (one of
    16384 x 262144 takes 32 GiB, which beside the tuner's inputs, outputs and timing sets does
    not fit even a 141 GB GPU). Where there is more than one block, a first pass finds each
    output's peak, so every block is held to the whole check's floor."""
    m, *row = inputs[row_inputs[0]].shape
    blocks = row_blocks(m, math.prod(row))

    def reference_of(rows: slice) -> Outputs:
        return reference(rows_of(inputs, row_inputs, rows))

    if len(blocks) < 2:
        return compare_outputs(outputs, reference(inputs))
    peaks = reference_peaks(reference_of(rows) for rows in blocks)
    for rows in blocks:
        why = compare_outputs([o[rows] for o in outputs], reference_of(rows), peaks)
        if why:
            return f"{rows_named(rows, m)}: {why}"
    return None


def within_one_rounding(
    out: torch.Tensor, ref64: torch.Tensor, *, slack: float = 4.0,
    extra: torch.Tensor | float = 0.0, peak: float | None = None,
) -> str | None:
    """Whether `out` is within about one rounding of its dtype of the float64 `ref64`.

    The bound per element is `slack` units of roundoff relative to |ref| plus the same absolute
    amount at the dtype's smallest normal, so values near zero are not held to relative error.
    `slack` covers the rounding of the intermediate steps a formula takes (e.g. x̂ rounded to
    the input dtype before the weight multiply in HF Llama semantics); `extra` adds a
    per-element bound for kernels whose own arithmetic errs more (long fp32 sums). Compared in
    blocks of rows of about `CHECK_ELEMS` elements. `peak`, where given, is the largest |ref|
    of a whole of which `ref64` is a part (the floor's scale; by default `ref64`'s own).
    """
    if out.shape != ref64.shape:
        return f"shape {tuple(out.shape)} != expected {tuple(ref64.shape)}"
    # On the output's device: a large problem's check moved to the host takes seconds.
    device = out.device
    outs, refs = out.detach().reshape(out.shape or (1,)), ref64.detach().reshape(out.shape or (1,))
    extras = (torch.broadcast_to(extra.to(device), out.shape).reshape(outs.shape)
              if isinstance(extra, torch.Tensor) else extra)
    if outs.numel() == 0:
        return None
    u, tiny = UNIT_ROUNDOFF[out.dtype], torch.finfo(out.dtype).tiny
    # The floor comes from the whole reference (max and -min: no |ref| copy of it).
    top = torch.maximum(refs.max(), -refs.min()) if peak is None else torch.tensor(peak)
    floor = top.double().to(device).clamp_min(tiny) * 2.0**-10
    row = outs[0].numel()
    nonfinite = bad = 0
    worst: tuple[float, int, float, float, float] | None = None  # excess, index, got, ref, bound
    for rows in row_blocks(outs.shape[0], row):
        o = outs[rows].double()
        finite = torch.isfinite(o)
        if not finite.all():
            nonfinite += int((~finite).sum())
            continue
        r = refs[rows].double().to(device)
        e = extras[rows] if isinstance(extras, torch.Tensor) else extras
        bound = slack * u * (r.abs() + floor) + e
        excess = ((o - r).abs() - bound).flatten()
        bad += int((excess > 0).sum())
        i = int(torch.argmax(excess))
        if excess[i] > 0 and (worst is None or excess[i].item() > worst[0]):
            worst = (excess[i].item(), rows.start * row + i, o.flatten()[i].item(),
                     r.flatten()[i].item(), bound.flatten()[i].item())
    if nonfinite:
        return f"{nonfinite} non-finite values"
    if worst is not None:
        _, i, got, expected, limit = worst
        return (f"{bad}/{outs.numel()} values off by more than the bound; worst at flat index "
                f"{i}: got {got:.8g}, expected {expected:.8g} (bound {limit:.3g})")
    return None


#: Rounding slack per output dtype, in units of roundoff: two for half precision (the final
#: rounding plus an intermediate one that may fall on the other side of a tie); for float32 the
#: fp32 sum of squares over up to 2^18 elements and the hardware rsqrt add a few ulps.
SLACK = {torch.float32: 64.0, torch.float16: 4.0, torch.bfloat16: 4.0}


def compare_outputs(
    outputs: Sequence[torch.Tensor], expected: Sequence[torch.Tensor],
    peaks: Sequence[float] | None = None,
) -> str | None:
    """Outputs against references: floating ones to a float64 (or same-dtype) reference within
    the output dtype's rounding slack, the others (integers, fp8 handled by their kernels) exactly.
    `peaks`: each reference's `within_one_rounding` peak, where they are parts of a whole.
    """
    if len(outputs) != len(expected):
        return f"{len(outputs)} outputs, expected {len(expected)}"
    for i, (o, e) in enumerate(zip(outputs, expected, strict=True)):
        if o.dtype in UNIT_ROUNDOFF and e.is_floating_point():
            why = within_one_rounding(o, e.double(), slack=SLACK[o.dtype],
                                      peak=None if peaks is None else peaks[i])
        elif o.dtype != e.dtype:
            why = f"dtype {o.dtype} != expected {e.dtype}"
        else:
            why = None if torch.equal(o, e.to(o.device)) else "values differ"
        if why:
            return f"output {i}: {why}"
    return None


# ----------------------------------------------------------------------------- validation


def check_eps(eps: float) -> float:
    if not isinstance(eps, int | float) or isinstance(eps, bool) or not math.isfinite(eps):
        raise ValueError(f"eps must be a finite number, got {eps!r}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    return float(eps)


def check_activation(x: Any, name: str = "x") -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in TORCH_DTYPES.values():
        raise TypeError(
            f"{name} has dtype {x.dtype}; supported: float32, float16, bfloat16"
        )
    if x.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension (the hidden size)")
    if x.shape[-1] == 0:
        raise ValueError(f"{name} has an empty last dimension (hidden size 0)")
    if x.device.type != "cuda" and not interpreting():
        raise ValueError(f"{name} is on {x.device}: the kernels run on CUDA devices, or on the "
                         "CPU under Triton's interpreter (TRITON_INTERPRET=1)")
    return x


def check_weight(w: Any, x: torch.Tensor, name: str = "weight") -> torch.Tensor:
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(w).__name__}")
    if not w.is_floating_point():
        raise TypeError(f"{name} has dtype {w.dtype}; it must be a floating-point tensor")
    if w.shape != (x.shape[-1],):
        raise ValueError(
            f"{name} has shape {tuple(w.shape)}, expected ({x.shape[-1]},) to match the last "
            f"dimension of the input"
        )
    check_same_device(x, w, name)
    return w


def check_same_device(x: torch.Tensor, other: torch.Tensor, name: str) -> None:
    if other.device != x.device:
        raise ValueError(f"{name} is on {other.device} but the input is on {x.device}")


def check_like(x: torch.Tensor, other: Any, name: str) -> torch.Tensor:
    """`other` must have x's shape, dtype and device (e.g. a residual or a gradient)."""
    if not isinstance(other, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(other).__name__}")
    if other.shape != x.shape:
        raise ValueError(f"{name} has shape {tuple(other.shape)}, expected {tuple(x.shape)}")
    if other.dtype != x.dtype:
        raise TypeError(f"{name} has dtype {other.dtype}, expected {x.dtype} like the input")
    check_same_device(x, other, name)
    return other


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """View as (M, N) with unit stride along N, copying only when no such view exists.

    Strided rows (e.g. a slice of a wider tensor) keep their row stride: the kernels take it.
    """
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.dim() == 2:
        return x
    try:
        return x.view(-1, x.shape[-1])
    except RuntimeError:
        return x.reshape(-1, x.shape[-1])


def launch_options(config: KernelConfig) -> dict[str, int]:
    """A config's Triton launch options (num_warps, num_stages): its lower-case fields.

    Upper-case fields are the kernel's constexpr parameters; the kernels read those themselves.
    """
    return config.launch_options


def interpreting() -> bool:
    """Whether Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1)."""
    import os

    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


#: SMs assumed without a GPU (interpreter, CPU): a few programs, so that persistent loops,
#: partial reductions and row splits are exercised with several row blocks per program.
INTERPRETER_SMS = 4


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device | str) -> int:
    """Streaming multiprocessors of the device the kernel runs on (a fixed few without a GPU)."""
    device = torch.device(device)
    if device.type != "cuda" or interpreting():
        return INTERPRETER_SMS
    return _cuda_sm_count(device.index if device.index is not None else
                          torch.cuda.current_device())


def shared_memory_per_sm() -> int | None:
    """Shared memory of one SM of this machine's GPU (bytes); None without one, under the
    interpreter, or where torch does not say."""
    if interpreting() or not torch.cuda.is_available():
        return None
    return _cuda_shared_memory(torch.cuda.current_device())


@functools.cache
def _cuda_shared_memory(index: int) -> int | None:
    return getattr(torch.cuda.get_device_properties(index), "shared_memory_per_multiprocessor",
                   None)


@functools.cache
def _cuda_capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def dependent_launch(device: torch.device | str) -> bool:
    """Whether kernels on `device` launch with programmatic dependent launch
    (`kerneltune.kernels._dependent_launch`): an NVIDIA GPU of sm_90 or later (not ROCm, whose
    capabilities count differently), not the interpreter."""
    device = torch.device(device)
    if device.type != "cuda" or torch.version.hip is not None or interpreting():
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_capability(index) >= (9, 0)


def overlaps_row_blocks(pdl: bool, grid: int, blocks: int) -> bool:
    """Whether a one-launch row kernel of `grid` programs over `blocks` row blocks launches as a
    programmatic dependent launch, given `pdl` (the device has it, and it is wanted): only where
    each program has one row block. A persistent grid whose programs loop over their blocks is
    launched the ordinary way: placed while the grid before it finishes, its programs need not
    spread evenly over the SMs, and an SM given one more than its share sets the pace (quant's
    persistent grid measured clearly slower so)."""
    return pdl and grid >= blocks


def row_block_grid(m: int, config: KernelConfig, device: torch.device | str) -> int:
    """Programs of a one-launch row kernel: one per row block of ROWS rows or, on a persistent
    grid (GRID_MULT > 1), at most GRID_MULT per SM, each looping over every P-th row block."""
    blocks = -(-m // config.ROWS)
    per_sm = config.GRID_MULT
    return blocks if per_sm == 1 else min(blocks, per_sm * sm_count(device))
