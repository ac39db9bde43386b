"""Typed launch configs: one frozen dataclass per kernel, mapped losslessly to the table's JSON.

A config's fields are the kernel's parameters, named as in the table's JSON and in the Triton
kernels (upper case: constexprs; lower case: launch options). Its JSON map is exactly its
fields; `from_json` takes that map back with each value's type checked exactly (``True`` is no
int, ``256.0`` and ``"256"`` are no int), so a config either round-trips or is refused. Which
values a problem allows, and which combinations, is the kernel spec's to say
(`KernelSpec.space`, `KernelSpec.valid`, `KernelSpec.parse`).

A field with a default is a parameter added after entries were first stored: an older entry
without it ran as the default says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, Self, get_type_hints

from kerneltune.table import ConfigValue


@dataclasses.dataclass(frozen=True, kw_only=True)
class KernelConfig(Mapping[str, ConfigValue]):
    """Base of the kernels' configs: frozen, hashable, and readable as its JSON map."""

    #: Field name -> its exact type, per class (filled on first use).
    _types: ClassVar[dict[str, type]]

    @classmethod
    def field_types(cls) -> dict[str, type]:
        if "_types" not in cls.__dict__:
            hints = get_type_hints(cls)
            cls._types = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
        return cls._types

    @classmethod
    def added_since(cls) -> dict[str, ConfigValue]:
        """The parameters added after entries were first stored, with the value older entries
        ran with."""
        return {f.name: f.default for f in dataclasses.fields(cls)
                if f.default is not dataclasses.MISSING}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        """The config a JSON map gives: every field present with exactly its type, nothing
        else (ValueError naming what is wrong otherwise)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a config is a JSON object, got {type(data).__name__}")
        types = cls.field_types()
        unknown = sorted(set(data) - set(types))
        missing = sorted(set(types) - set(data))
        if unknown or missing:
            raise ValueError(f"{cls.__name__}: " + "; ".join(
                [f"unknown parameters {unknown}"] * bool(unknown)
                + [f"missing parameters {missing}"] * bool(missing)))
        wrong = [f"{name}={data[name]!r} is not {kind.__name__}" for name, kind in types.items()
                 if type(data[name]) is not kind]
        if wrong:
            raise ValueError(f"{cls.__name__}: {'; '.join(wrong)}")
        return cls(**data)

    def to_json(self) -> dict[str, ConfigValue]:
        """The table's JSON config: every field by name."""
        return {name: getattr(self, name) for name in self.field_types()}

    def replace(self, **changes: ConfigValue) -> Self:
        return dataclasses.replace(self, **changes)

    # Read as a mapping, so that a config prints, compares in tests and serialises as its JSON.
    def __getitem__(self, name: str) -> ConfigValue:
        if name not in self.field_types():
            raise KeyError(name)
        return getattr(self, name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.field_types())

    def __len__(self) -> int:
        return len(self.field_types())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_json()})"

    @property
    def launch_options(self) -> dict[str, int]:
        """Triton's launch options (num_warps, num_stages): the lower-case fields."""
        return {name: getattr(self, name) for name in self.field_types() if name.islower()}


@dataclasses.dataclass(frozen=True, repr=False, kw_only=True)
class RowTilingConfig(KernelConfig):
    """The row tiling of the forward family: a block of BLOCK_N columns over ROWS rows a
    program; the whole row in registers (SINGLE) or looped over chunks; an eviction hint for
    the rows (EVICT); a row split over cooperating programs (COOP); GRID_MULT programs an SM
    for a persistent grid or a split."""

    BLOCK_N: int
    SINGLE: bool
    ROWS: int
    EVICT: bool
    num_warps: int
    num_stages: int
    COOP: bool = False
    GRID_MULT: int = 1


@dataclasses.dataclass(frozen=True, repr=False, kw_only=True)
class ForwardConfig(RowTilingConfig):
    """The forward's: a whole row's program releases the next grid of a dependent launch as it
    exits (LATE_RELEASE) rather than after its loads."""

    LATE_RELEASE: bool = False


@dataclasses.dataclass(frozen=True, repr=False, kw_only=True)
class QuantConfig(RowTilingConfig):
    """Quant's: a whole row in two blocks (PARTS = 2, BLOCK_N the first), q stored in x's
    layout (X_LAYOUT)."""

    PARTS: int = 1
    X_LAYOUT: bool = False


@dataclasses.dataclass(frozen=True, repr=False, kw_only=True)
class BackwardConfig(KernelConfig):
    """The backward's: the row tiling's block, rows and grid, the next row block loaded ahead
    (PREFETCH), and where dw's partial sums live (DW: registers, global, columns, split)."""

    BLOCK_N: int
    SINGLE: bool
    PREFETCH: bool = False
    DW: str
    ROWS: int
    GRID_MULT: int
    EVICT: bool
    num_warps: int
    num_stages: int
