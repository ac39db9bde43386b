"""Programmatic dependent launch (sm_90 and later): a kernel launched with it is placed on the
SMs while the kernel before it in the stream finishes, and waits for that kernel's memory
before it touches any.

A kernel launched with ``launch_pdl=True`` calls `wait_prior_grid` before its first load or
store: ``griddepcontrol.wait`` returns once the grid before it has completed and its writes are
visible (that grid waited for its own, so everything earlier in the stream is done too). Its
programs call `release_next_grid` once they have nothing left but arithmetic and stores
(``griddepcontrol.launch_dependents``): the next grid is placed once every program of this one
has released it, or exited, so its programs never take an SM slot that a program of this grid
still waits for, and they wait at their own `wait_prior_grid`. What the pair saves is the next
grid's launch, made while this one finishes instead of after it.

Programs release after their last loads, not at their start: released at the start of the
backward's main kernel, the waiting reduction programs slowed it down, where released after
its loads they make the whole backward faster than without PDL.

A kernel launched the ordinary way waits for nothing at ``griddepcontrol.wait``. The
instructions are compiled only with PDL, which the launchers set where the device has them
(`kerneltune.kernels._spec.dependent_launch`).

Device code: hashed with the kernels that call it (`DEVICE_CODE_FROM`).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def wait_prior_grid(PDL: tl.constexpr):
    """With PDL: wait until the previous grid in the stream has completed and its writes show."""
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def release_next_grid(PDL: tl.constexpr):
    """With PDL: let the next grid in the stream be placed once every program got here."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
