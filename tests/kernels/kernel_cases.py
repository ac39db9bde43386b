"""Random cases for the kernels' property tests: a problem, a valid config of its space, and
fresh inputs, so each test states only its problems, options and what must hold."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from hypothesis import strategies as st

from kerneltune.kernels import Inputs, KernelConfig, KernelSpec, Problem
from kerneltune.table import ConfigValue


def draw_case(data: st.DataObject, spec: KernelSpec, problems: Sequence[tuple[int, int, str]],
              option: str, choices: Sequence[ConfigValue]
              ) -> tuple[Problem, KernelConfig, Inputs]:
    m, n, dtype = data.draw(st.sampled_from(problems))
    problem = spec.problem(m, n, dtype, **{option: data.draw(st.sampled_from(choices))})
    config = data.draw(st.sampled_from(list(spec.configs(problem))))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return problem, config, spec.make_inputs(problem, data.draw(st.integers(0, 2**16)), device)
