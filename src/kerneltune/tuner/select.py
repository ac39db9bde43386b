"""Choosing the winner among re-timed finalists, the same way every time.

The search's best trial is one noisy measurement. The finalists (the best few plus the default)
are re-timed round-robin, so drift in clocks or temperature hits them all alike; each gets the
median of its round times. Finalists within the noise of the fastest (at least `MIN_TIE`
relative) are tied, and a tie goes to the first in a fixed order: the default config, then the
canonical order of the search space. So two runs over the same measurements pick the same
config, and a config that does not beat the default beyond noise never replaces it.

A key whose calls' row counts are known (recorded by runtimes) is timed at a few of them, its
time their mean, which the largest dominate. So its pick is checked at the fewest rows the calls
have, beside the runner-up and the default (`holds_at`); where another is faster there beyond
noise, the key goes to the contender that does best over the row counts, each weighing alike
(`best_over_rows`): the least mean, over the row counts r, of t(r) / the fastest t(r).
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


def holds_at(pick: KernelConfig, measured: Sequence[Measured], *, min_tie: float = MIN_TIE
             ) -> bool:
    """Whether `pick`, re-timed beside other contenders at one row count (`measured`), is no
    slower there than any of them beyond noise (a pick that did not run there does not hold)."""
    mine = next((f for f in measured if f.config == pick), None)
    if mine is None:
        return False
    return not any(f.median_us < mine.median_us and not is_tie(f, mine, min_tie=min_tie)
                   for f in measured if f.config != pick)


def best_over_rows(timed: Mapping[int, Sequence[Measured]],
                   order: Callable[[KernelConfig], tuple], *, min_tie: float = MIN_TIE
                   ) -> KernelConfig | None:
    """The contender that does best over the row counts of `timed` (row count -> the
    contenders re-timed there): the least mean relative time (its time over the fastest's at
    each row count), those within `min_tie` of it tied and the tie going to the first in
    `order`. Only contenders measured at every row count compete; None where there is none."""
    if not timed:
        return None
    per_row = [{f.config: f.median_us for f in measured} for measured in timed.values()]
    everywhere = [c for c in per_row[0] if all(c in row for row in per_row)]
    if not everywhere:
        return None

    def score(config: KernelConfig) -> float:
        return statistics.fmean(row[config] / min(row[c] for c in everywhere) for row in per_row)

    best = min(score(c) for c in everywhere)
    return min((c for c in everywhere if score(c) <= best * (1 + min_tie)), key=order)
