"""The loads the layer norm's kernels share, forward and backward: a block as fp32 with an
eviction hint, and an optional per-column vector (w or b) that stands in as a constant where
the layer has none.

Device code: hashed with the kernels that call it (`DEVICE_CODE_FROM`).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_f32(ptrs, mask, POLICY: tl.constexpr):
    """A block as fp32, zero where masked, with an eviction hint (none: "")."""
    return tl.load(ptrs, mask=mask, other=0.0, eviction_policy=POLICY).to(tl.float32)


@triton.jit
def column_vector(P, c, c_ok, HAS: tl.constexpr, ABSENT: tl.constexpr):
    """P over the columns `c` in fp32 (zero past N); ABSENT where there is no P (w = 1, b = 0)."""
    if HAS:
        v = tl.load(P + c, mask=c_ok, other=0.0).to(tl.float32)
    else:
        v = tl.where(c_ok, ABSENT, 0.0)
    return v
