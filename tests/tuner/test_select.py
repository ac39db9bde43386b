"""The final pick: deterministic given the same measurements, and the default kept on ties."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from kerneltune.kernels import REGISTRY, KernelConfig
from kerneltune.tuner.select import Measured, canonical_order, is_tie, pick_winner


@dataclasses.dataclass(frozen=True, repr=False, kw_only=True)
class Blocked(KernelConfig):
    BLOCK: int
    num_warps: int


SPACE = {"BLOCK": [256, 512, 1024], "num_warps": [1, 2, 4, 8]}
DEFAULT = Blocked(BLOCK=1024, num_warps=4)
ORDER = canonical_order(SPACE, DEFAULT)


def m(block: int, warps: int, *rounds: float) -> Measured:
    return Measured(Blocked(BLOCK=block, num_warps=warps), tuple(rounds))


def all_orders(finalists: list[Measured]) -> set[tuple]:
    """The winner's config for every order the finalists could arrive in."""
    return {tuple(pick_winner(list(p), ORDER).config.to_json().items())
            for p in itertools.permutations(finalists)}


def test_order_puts_the_default_first_then_the_space_order():
    configs = [Blocked(BLOCK=b, num_warps=w) for b in (1024, 256, 512) for w in (8, 1)]
    ranked = sorted([*configs, DEFAULT], key=ORDER)
    assert ranked[0] == DEFAULT
    assert [c.to_json() for c in ranked[1:]] == [
        {"BLOCK": 256, "num_warps": 1}, {"BLOCK": 256, "num_warps": 8},
        {"BLOCK": 512, "num_warps": 1}, {"BLOCK": 512, "num_warps": 8},
        {"BLOCK": 1024, "num_warps": 1}, {"BLOCK": 1024, "num_warps": 8}]


def test_a_value_outside_the_space_orders_after_those_inside():
    inside, outside = Blocked(BLOCK=256, num_warps=8), Blocked(BLOCK=128, num_warps=1)
    assert sorted([outside, inside], key=ORDER) == [inside, outside]


def test_a_clear_winner_wins_whatever_the_order():
    finalists = [m(1024, 4, 100, 101, 100), m(512, 2, 80, 80.5, 80.2), m(256, 1, 95, 95, 95)]
    assert all_orders(finalists) == {(("BLOCK", 512), ("num_warps", 2))}


def test_default_is_kept_unless_beaten_beyond_one_percent():
    finalists = [m(1024, 4, 100, 100, 100), m(512, 2, 99.5, 99.4, 99.6), m(256, 8, 99.2, 99.3)]
    assert all_orders(finalists) == {tuple(DEFAULT.to_json().items())}


def test_default_is_kept_when_the_difference_is_within_noise():
    noisy = m(512, 2, 80, 90, 120)  # median 90, noise (120 - 80) / 2 / 90 = 22%
    default = m(1024, 4, 100, 101, 99)
    assert is_tie(noisy, default)
    assert all_orders([noisy, default]) == {tuple(DEFAULT.to_json().items())}


def test_ties_between_non_defaults_go_to_the_canonical_order():
    finalists = [m(1024, 4, 120, 120), m(512, 8, 90.3, 90.2), m(512, 1, 90.6, 90.5),
                 m(256, 8, 89.9, 90.0)]
    # all three within 1% of the fastest (256, 8); (256, 8) is also first in space order
    assert all_orders(finalists) == {(("BLOCK", 256), ("num_warps", 8))}
    finalists[-1] = m(1024, 8, 89.9, 90.0)  # now the fastest comes last in space order
    assert all_orders(finalists) == {(("BLOCK", 512), ("num_warps", 1))}


def test_same_times_pick_the_same_config_from_the_real_space():
    spec = REGISTRY["rmsnorm_fwd"]
    problem = spec.problem(64, 4096, "bfloat16")
    order = canonical_order(spec.space(problem), spec.default(problem))
    configs = list(spec.configs(problem))[:6]
    finalists = [Measured(c, (10.0, 10.0)) for c in configs]
    winners = {pick_winner(list(p), order).config for p in itertools.permutations(finalists)}
    assert winners == {min(configs, key=order)}


def test_no_finalists_is_an_error():
    with pytest.raises(ValueError):
        pick_winner([], ORDER)
