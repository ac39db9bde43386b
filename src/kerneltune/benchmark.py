"""Time the config the runtime resolves for a shape against the kernel's default config.

What `kerneltune bench` prints: for each (kernel, N, M), where the runtime's config comes from
(table, service, shipped table or default), its time and GB/s, and the default config's time,
both measured here, the same way as the tuner measures (graph replay on a GPU; wall clock under
the Triton interpreter, labelled as such).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from kerneltune.env import on_gpu
from kerneltune.kernels import KernelConfig, get_spec
from kerneltune.runtime import explain
from kerneltune.tuner.timing import copy_bandwidth_gbps, rotating_inputs, time_config


@dataclass(frozen=True)
class BenchRow:
    kernel: str
    n: int
    m: int
    dtype: str
    source: str
    match: str
    config: KernelConfig
    us: float
    default_us: float
    gbps: float
    frac_copy: float | None
    method: str

    @property
    def speedup(self) -> float:
        return self.default_us / self.us

    def to_json(self) -> dict[str, Any]:
        """The row as JSON: its fields, the config as the table writes it, the speedup."""
        return {**asdict(self), "config": self.config.to_json(), "speedup": self.speedup}


def compare(kernel: str, ns: list[int], ms: list[int], dtype: str = "bfloat16"
            ) -> list[BenchRow]:
    spec = get_spec(kernel)
    device = "cuda" if on_gpu() else "cpu"
    copy = copy_bandwidth_gbps(device)
    rows = []
    for n in ns:
        for m in ms:
            problem = spec.problem(m, n, dtype)
            resolved = explain(kernel, (m, n, dtype))
            sets = rotating_inputs(spec, problem, device=device) if device == "cuda" else None
            timings = {}
            for name, config in (("resolved", resolved.config), ("default", spec.default(problem))):
                timings[name] = time_config(spec, problem, config, device=device, input_sets=sets)
            us = timings["resolved"].median_us
            gbps = spec.bytes_moved(problem) / (us * 1e-6) / 1e9
            rows.append(BenchRow(kernel, n, m, dtype, resolved.source, resolved.match,
                                 resolved.config, us, timings["default"].median_us, gbps,
                                 gbps / copy if copy else None, timings["resolved"].method))
            del sets
            if device == "cuda":
                torch.cuda.empty_cache()
    return rows
