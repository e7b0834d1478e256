"""Programmatic dependent launch: a step's kernels launch while the one ahead of them drains.

On Hopper and later GPUs a kernel launched with ``launch_pdl`` may place its programs on the
SMs before the kernel ahead of it in the stream has finished. Every kernel here takes
``DEPENDENT: tl.constexpr`` and keeps two rules:

- ``await_prior_grid(DEPENDENT)`` is its first statement, before any memory access: it
  returns once the kernel ahead has completed and its writes are visible;
- ``release_next_grid(DEPENDENT)`` comes after that wait (right after it, unless the kernel
  says otherwise): the next kernel launches once every program has released or exited.

So no kernel touches memory before every earlier kernel in the stream is done (each one
ahead waited in turn): only the launch latency and the ramp of each grid are hidden, never
an ordering. Without ``DEPENDENT`` both are no-ops.

``KDA_DEPENDENT_LAUNCH=0`` in the environment turns it off (plain stream order).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

_MIN_MAJOR = 9  # griddepcontrol: sm_90 and later


@functools.lru_cache(maxsize=None)
def _supported(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= _MIN_MAJOR


def dependent_launch(device: torch.device) -> dict[str, bool]:
    """Launch options of a kernel on ``device``: its ``DEPENDENT`` argument and ``launch_pdl``,
    both true on CUDA devices of compute capability 9.0 or later unless
    ``KDA_DEPENDENT_LAUNCH=0``."""
    enabled = (device.type == "cuda" and os.environ.get("KDA_DEPENDENT_LAUNCH", "1") != "0"
               and _supported(device.index if device.index is not None else torch.cuda.current_device()))
    return {"DEPENDENT": enabled, "launch_pdl": enabled}


@triton.jit
def await_prior_grid(DEPENDENT: tl.constexpr):
    """Wait until the kernel ahead in the stream has completed, its writes visible."""
    if DEPENDENT:
        gdc_wait()


@triton.jit
def release_next_grid(DEPENDENT: tl.constexpr):
    """Let the next kernel in the stream launch once every program of this one has released
    or exited; only after ``await_prior_grid``."""
    if DEPENDENT:
        gdc_launch_dependents()
