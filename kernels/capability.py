"""What the CUDA device under a tensor can do, asked once per device.

Programmatic dependent launch (``kernels.dependent_launch``) needs Hopper (sm_90) or later.
"""

from __future__ import annotations

import functools

import torch

_HOPPER_MAJOR = 9


@functools.lru_cache(maxsize=None)
def _major(device_index: int) -> int:
    return torch.cuda.get_device_capability(device_index)[0]


def is_hopper_or_later(device: torch.device) -> bool:
    """True for a CUDA device of compute capability 9.0 or later (the current device where
    ``device`` has no index); False for any other device, CPU included."""
    if device.type != "cuda":
        return False
    return _major(device.index if device.index is not None else torch.cuda.current_device()) >= _HOPPER_MAJOR
