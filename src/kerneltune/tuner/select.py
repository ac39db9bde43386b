"""Choosing the winner among re-timed finalists, the same way every time.

The search's best trial is one noisy measurement. The finalists (the best few plus the default)
are re-timed round-robin, so drift in clocks or temperature hits them all alike; each gets the
median of its round times. Finalists within the noise of the fastest (at least `MIN_TIE`
relative) are tied, and a tie goes to the first in a fixed order: the default config, then the
canonical order of the search space. So two runs over the same measurements pick the same
config, and a config that does not beat the default beyond noise never replaces it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kerneltune.table import ConfigValue

if TYPE_CHECKING:
    from kerneltune.kernels import KernelConfig

#: Relative difference below which two times are a tie whatever the measured noise.
MIN_TIE = 0.01


@dataclass(frozen=True)
class Measured:
    """A finalist and its per-round median times (µs)."""

    config: KernelConfig
    rounds_us: tuple[float, ...]

    @property
    def median_us(self) -> float:
        return statistics.median(self.rounds_us)

    @property
    def noise(self) -> float:
        """Relative spread of the round times: half their range over the median."""
        if len(self.rounds_us) < 2:
            return 0.0
        return (max(self.rounds_us) - min(self.rounds_us)) / 2 / self.median_us


def canonical_order(space: Mapping[str, Sequence[ConfigValue]], default: KernelConfig
                    ) -> Callable[[KernelConfig], tuple]:
    """Sort key of the tie-break: the default first, then the order of `itertools.product`
    over the space (each parameter's position in its list of choices, parameters in order; a
    value not among them after those that are)."""

    def key(config: KernelConfig) -> tuple:
        values = ((getattr(config, name), list(choices)) for name, choices in space.items())
        position = tuple(choices.index(value) if value in choices else len(choices)
                         for value, choices in values)
        return (config != default, position)

    return key


def is_tie(a: Measured, b: Measured, *, min_tie: float = MIN_TIE) -> bool:
    """Whether two finalists' times are within noise (or `min_tie`) of each other."""
    tolerance = max(min_tie, a.noise, b.noise)
    fast, slow = sorted((a.median_us, b.median_us))
    return slow <= fast * (1 + tolerance)


def pick_winner(finalists: Sequence[Measured], order: Callable[[KernelConfig], tuple], *,
                min_tie: float = MIN_TIE) -> Measured:
    """The first finalist in `order` that ties with the fastest."""
    if not finalists:
        raise ValueError("no finalists to choose from")
    fastest = min(finalists, key=lambda f: (f.median_us, order(f.config)))
    tied = [f for f in finalists if is_tie(f, fastest, min_tie=min_tie)]
    return min(tied, key=lambda f: order(f.config))
