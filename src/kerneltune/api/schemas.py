"""The service's request and response bodies (what /docs and /openapi.json describe)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from kerneltune.table import DTYPES

MAX_N = 1 << 22
MAX_M = 1 << 31
MAX_NAME = 200  # a GPU model name (the store's column width)
MAX_KERNEL = 64
MAX_HASH = 128
MAX_ENTRIES = 10_000

Dtype = Literal["float32", "float16", "bfloat16"]
assert set(Dtype.__args__) == set(DTYPES)  # type: ignore[attr-defined]

Name = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME)]
KernelName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_KERNEL)]
ParamName = Annotated[str, StringConstraints(min_length=1, max_length=64)]
Version = Annotated[str, StringConstraints(max_length=64)]
# Strict members keep 4 an int and True a bool when they travel through a config.
ConfigValue = (
    Annotated[bool, Field(strict=True)]
    | Annotated[int, Field(strict=True)]
    | Annotated[float, Field(allow_inf_nan=False)]
    | Annotated[str, StringConstraints(max_length=64)]
)
Config = Annotated[dict[ParamName, ConfigValue], Field(min_length=1, max_length=64)]
PositiveTime = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class Error(BaseModel):
    detail: str


class Key(BaseModel):
    """Where an answer came from: the tuned shape (N exact, M its power-of-two bucket), in the
    dtype asked about or in the other 16-bit one."""

    n: int
    m: int
    dtype: Dtype


class Measurement(BaseModel):
    """What was measured for the config of a tuned entry."""

    us: float = Field(description="median GPU time of the tuned config, microseconds")
    gbps: float = Field(description="minimum bytes moved over that time, GB/s")
    frac_copy: float | None = Field(description="gbps over the device's measured copy bandwidth")
    default_us: float = Field(description="time of the heuristic default config, microseconds")
    speedup: float | None = Field(description="default_us / us")
    trials: int
    kernel_hash: str
    stale: bool = Field(description="measured on kernel source other than the running one")


class ConfigAnswer(BaseModel):
    kernel: str
    gpu: str = Field(description="the GPU model name as the driver reports it")
    dtype: Dtype
    n: int
    m: int = Field(description="the row count asked about")
    m_bucket: int = Field(description="m rounded up to its power-of-two bucket")
    match: Literal["exact", "nearest", "transfer", "default"]
    transfer_from: str | None = Field(
        None, description="for a transfer: the GPU model whose tuned entry this is")
    key: Key | None = Field(description="the tuned shape the config comes from; null for default")
    config: dict[str, Any]
    measurement: Measurement | None
    kernel_hash: str = Field(description="hash of the running kernel source")


class GpuInfo(BaseModel):
    name: str
    slug: str
    entries: int
    copy_gbps: float | None
    kernels: list[str]


class KernelInfo(BaseModel):
    name: str
    description: str
    kernel_hash: str
    parameters: dict[str, list[Any]] = Field(
        description="each tunable parameter with its choices (at M = N = 4096; some depend on "
        "the shape)"
    )
    options: dict[str, list[Any]]
    default: dict[str, Any] = Field(description="the heuristic config at M = N = 4096, bfloat16")


class EnvIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    triton: Version | None = None
    torch: Version | None = None
    cuda: Version | None = None
    driver: Version | None = None
    python: Version | None = None


class EntryIn(BaseModel):
    """One entry of the table format."""

    model_config = ConfigDict(extra="ignore")

    kernel: KernelName
    dtype: Dtype
    n: int = Field(ge=1, le=MAX_N)
    m: int = Field(ge=1, le=MAX_M, description="a power-of-two M bucket")
    config: Config
    us: PositiveTime
    gbps: NonNegative
    default_us: PositiveTime
    trials: int = Field(ge=0, le=1 << 31)
    kernel_hash: Annotated[str, StringConstraints(max_length=MAX_HASH)]
    frac_copy: NonNegative | None = None
    default_config: Config | None = None
    env: EnvIn | None = None


class ResultsIn(BaseModel):
    """Entries to publish for one GPU: ``{device, entries}`` or a whole table document."""

    model_config = ConfigDict(extra="ignore")

    schema_: Literal[1] = Field(1, alias="schema")
    device: Name
    env: EnvIn | None = None
    copy_gbps: NonNegative | None = None
    entries: list[EntryIn] = Field(min_length=1, max_length=MAX_ENTRIES,
                                   description="at least one: an empty post stores nothing")


class TuningKey(BaseModel):
    kernel: str
    dtype: str
    n: int
    m: int


class ResultsOut(BaseModel):
    device: str
    stored: list[TuningKey] = Field(description="entries that were new or faster than the stored")
    kept: list[TuningKey] = Field(description="entries not stored: the store had one as fast")


class Health(BaseModel):
    status: Literal["ok"]


class Ready(BaseModel):
    status: Literal["ready"]


#: Keys and row counts one report may carry (a runtime sends what it met since its last one).
MAX_REPORT_KEYS = 256
MAX_REPORT_ROWS = 64


class MissIn(BaseModel):
    """A key a model process resolved other than exactly."""

    kernel: KernelName
    dtype: Dtype
    n: int = Field(ge=1, le=MAX_N)
    m: int = Field(ge=1, le=MAX_M, description="a power-of-two M bucket")
    processes: int = Field(1, ge=1, le=1 << 20, description="processes that met the key")
    rows: list[Annotated[int, Field(ge=1, le=MAX_M)]] = Field(
        default_factory=list, max_length=MAX_REPORT_ROWS,
        description="row counts met in this bucket")


class MissesIn(BaseModel):
    """A runtime's report of the keys it ran untuned on one GPU model."""

    device: Name
    keys: list[MissIn] = Field(min_length=1, max_length=MAX_REPORT_KEYS)


class MissesRecorded(BaseModel):
    device: str
    recorded: int = Field(description="keys recorded")
    unknown_kernels: list[str] = Field(
        default_factory=list, description="kernels this service does not know: their keys are "
                                          "left out")


class MissOut(BaseModel):
    kernel: str
    dtype: str
    n: int
    m: int
    processes: int = Field(description="processes that reported the key")
    rows: list[int] = Field(description="a spread sample of the row counts met, sorted")
    first_seen: datetime
    last_seen: datetime
    tuned: bool = Field(description="the store has an entry for it on the running kernel code")


class MissesOut(BaseModel):
    device: str
    keys: list[MissOut]
