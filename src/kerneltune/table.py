"""The tuned table: the versioned JSON unit of exchange between tuner, store, service and runtime.

One module reads, writes and validates it. It depends on the standard library alone, so the
runtime can load a table without the service's or the store's dependencies.

Outline (fields may be added; these are kept)::

    {"schema": 1, "device": "NVIDIA H100 80GB HBM3",
     "env": {"triton": "3.6.0", "torch": "2.11.0+cu130", "cuda": "13.0", "driver": "580.159.04"},
     "copy_gbps": 3010.0,
     "entries": [{"kernel": "rmsnorm_fwd", "dtype": "bfloat16", "n": 4096, "m": 2048,
                  "config": {"BLOCK_N": 2048, "num_warps": 4}, "us": 12.3, "gbps": 2724.0,
                  "default_us": 13.6, "trials": 40, "kernel_hash": "9f2c..."}]}
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

SCHEMA = 1
DTYPES = ("float32", "float16", "bfloat16")
#: The other dtype of the same width: the kernels move the same bytes and do the same fp32
#: arithmetic in both, so a config tuned for one is the best guess for the other (measured on
#: an H200: the bf16 winner was nearly always the fp16 winner or within a few percent of it,
#: closer than the default heuristic).
SAME_WIDTH = {"bfloat16": "float16", "float16": "bfloat16"}


def with_same_width(dtype: str) -> list[str]:
    """`dtype`, then the other dtype of its width if it has one: the order to look for its
    tuned configs in."""
    return [dtype, SAME_WIDTH[dtype]] if dtype in SAME_WIDTH else [dtype]


#: Device name under which results measured by the Triton interpreter on a CPU are filed, so they
#: are never mixed with a GPU's.
INTERPRETER_DEVICE = "triton-interpreter (cpu)"

#: A CUDA compute capability as tables write it: major.minor.
COMPUTE_CAPABILITY = re.compile(r"\d{1,3}\.\d{1,3}")

ConfigValue = int | float | str | bool
Config = dict[str, ConfigValue]


class TableError(ValueError):
    """A table file or document that does not follow the format."""


def m_bucket(m: int) -> int:
    """The M bucket of a row count: the next power of two at or above it (1 for 0 or 1 rows)."""
    if m < 0:
        raise ValueError(f"row count must be >= 0, got {m}")
    return 1 if m <= 1 else 1 << (m - 1).bit_length()


def device_slug(device: str) -> str:
    """A file-name-safe form of a GPU name: 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    if not slug:
        raise ValueError(f"device name {device!r} has no letters or digits")
    return slug


@dataclass(frozen=True)
class Env:
    """Versions of the software a measurement was taken with."""

    triton: str | None = None
    torch: str | None = None
    cuda: str | None = None
    driver: str | None = None
    python: str | None = None


@dataclass
class Entry:
    """The best config found for one tuning key (device, kernel, dtype, n, m bucket)."""

    kernel: str
    dtype: str
    n: int
    m: int
    config: Config
    us: float
    gbps: float
    default_us: float
    trials: int
    kernel_hash: str
    frac_copy: float | None = None
    default_config: Config | None = None
    env: Env | None = None

    @property
    def key(self) -> tuple[str, str, int, int]:
        return (self.kernel, self.dtype, self.n, self.m)

    @property
    def speedup(self) -> float:
        """Default config's time over the tuned config's time."""
        return self.default_us / self.us if self.us > 0 else math.nan


@dataclass
class Table:
    device: str
    env: Env = field(default_factory=Env)
    copy_gbps: float | None = None
    entries: list[Entry] = field(default_factory=list)
    schema: int = SCHEMA
    #: The GPU's CUDA compute capability ("9.0"), which ranks the tables a GPU without an entry
    #: of its own borrows from (`kerneltune.resolution.rank_transfers`).
    compute_capability: str | None = None

    def sorted(self) -> Table:
        """The same table with its entries in the canonical order (kernel, dtype, n, m)."""
        return replace(self, entries=sorted(self.entries, key=lambda e: e.key))

    def index(self) -> dict[tuple[str, str, int, int], Entry]:
        return {e.key: e for e in self.entries}


# --------------------------------------------------------------------------- serialisation


def entry_to_dict(e: Entry) -> dict[str, Any]:
    """An entry as a table file holds it (with its speedup; absent optional fields left out)."""
    d = asdict(e)
    d["speedup"] = round(e.speedup, 4) if math.isfinite(e.speedup) else None
    for optional in ("frac_copy", "default_config", "env"):
        if d[optional] is None:
            del d[optional]
    return d


def table_to_dict(table: Table) -> dict[str, Any]:
    t = table.sorted()
    return {
        "schema": t.schema,
        "device": t.device,
        "env": asdict(t.env),
        "copy_gbps": t.copy_gbps,
        **({"compute_capability": t.compute_capability} if t.compute_capability else {}),
        "entries": [entry_to_dict(e) for e in t.entries],
    }


def dumps(table: Table) -> str:
    """Canonical JSON text: the same table always gives the same bytes (stable ETags and diffs)."""
    return json.dumps(table_to_dict(table), indent=1, sort_keys=True) + "\n"


def save(table: Table, path: str | Path) -> Path:
    """Write atomically: a reader never sees half a table."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(dumps(table))
    tmp.replace(path)
    return path


def _require(cond: bool, where: str, msg: str) -> None:
    if not cond:
        raise TableError(f"{where}: {msg}")


def _number(d: dict[str, Any], name: str, where: str, *, optional: bool = False) -> float | None:
    v = d.get(name)
    if v is None and optional:
        return None
    _require(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v),
        where, f"{name!r} must be a finite number, got {v!r}",
    )
    return float(v)


def _config(v: Any, where: str) -> Config:
    _require(isinstance(v, dict) and bool(v), where, "config must be a non-empty object")
    for k, x in v.items():
        ok = isinstance(x, int | float | str | bool)
        _require(ok, where, f"config value {k!r}={x!r} is not a scalar")
    return dict(v)


def _env(v: Any, where: str) -> Env:
    _require(isinstance(v, dict), where, "env must be an object")
    known = {k: (None if v.get(k) is None else str(v[k])) for k in Env.__dataclass_fields__}
    return Env(**known)


def _entry_from_dict(d: Any, where: str) -> Entry:
    _require(isinstance(d, dict), where, "entry must be an object")
    _require(isinstance(d.get("kernel"), str) and d["kernel"], where, "'kernel' must be a name")
    _require(d.get("dtype") in DTYPES, where,
             f"'dtype' must be one of {DTYPES}, got {d.get('dtype')!r}")
    for name in ("n", "m", "trials"):
        v = d.get(name)
        _require(isinstance(v, int) and not isinstance(v, bool) and v >= 0, where,
                 f"{name!r} must be a non-negative integer, got {v!r}")
    _require(d["n"] > 0, where, "'n' must be positive")
    _require(d["m"] == m_bucket(d["m"]), where, f"'m' must be a power-of-two bucket, got {d['m']}")
    _require(isinstance(d.get("kernel_hash"), str), where, "'kernel_hash' must be a string")
    return Entry(
        kernel=d["kernel"], dtype=d["dtype"], n=d["n"], m=d["m"],
        config=_config(d.get("config"), where),
        us=_number(d, "us", where), gbps=_number(d, "gbps", where),  # type: ignore[arg-type]
        default_us=_number(d, "default_us", where),  # type: ignore[arg-type]
        trials=d["trials"], kernel_hash=d["kernel_hash"],
        frac_copy=_number(d, "frac_copy", where, optional=True),
        default_config=None if d.get("default_config") is None
        else _config(d["default_config"], where),
        env=None if d.get("env") is None else _env(d["env"], where),
    )


def table_from_dict(doc: Any) -> Table:
    _require(isinstance(doc, dict), "table", "must be a JSON object")
    _require(doc.get("schema") == SCHEMA, "table",
             f"unsupported schema {doc.get('schema')!r} (this version reads {SCHEMA})")
    # Blank is no name: the store refuses it too (whitespace such as "\v" included).
    _require(isinstance(doc.get("device"), str) and doc["device"].strip(), "table",
             "'device' must be a name")
    entries = doc.get("entries")
    _require(isinstance(entries, list), "table", "'entries' must be a list")
    parsed = [_entry_from_dict(e, f"entries[{i}]") for i, e in enumerate(entries)]
    keys = [e.key for e in parsed]
    _require(len(set(keys)) == len(keys), "table", "duplicate (kernel, dtype, n, m) entries")
    capability = doc.get("compute_capability")
    _require(capability is None or (isinstance(capability, str)
                                    and COMPUTE_CAPABILITY.fullmatch(capability) is not None),
             "table", f"'compute_capability' must be like \"9.0\", got {capability!r}")
    return Table(
        device=doc["device"],
        env=_env(doc.get("env", {}), "table.env"),
        copy_gbps=_number(doc, "copy_gbps", "table", optional=True),
        entries=parsed,
        compute_capability=capability,
    )


def loads(text: str | bytes) -> Table:
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TableError(f"not JSON: {e}") from e
    return table_from_dict(doc)


def load(path: str | Path) -> Table:
    path = Path(path)
    try:
        return loads(path.read_bytes())
    except TableError as e:
        raise TableError(f"{path}: {e}") from e


def shipped_tables_dir() -> Path:
    """Where the package keeps its tuned tables, one JSON file per GPU model."""
    return Path(__file__).parent / "tables"


def shipped_table_path(device: str) -> Path:
    return shipped_tables_dir() / f"{device_slug(device)}.json"
