"""State blocks through a tensor descriptor: verify's state loads by the copy engine.

Verify's state kernel reads each ``[BV, BKK]`` block of its slot once. Through a
tensor descriptor (``TensorDescriptor`` over the checkpoint's rows, ``[slots * H * V, K]``)
Triton issues each block as one bulk copy (TMA on sm_90) into shared memory, pipelined like
the pointer loads it replaces, with no per-element addresses or masks in the program.
A block never crosses a (slot, head) when ``BV`` divides ``V``, which the launch
configuration requires. The Triton interpreter runs descriptors too (CPU tensors).
"""

from __future__ import annotations

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels.capability import is_hopper_or_later


def state_block_descriptor(state: torch.Tensor, block_v: int, block_k: int, wanted: bool) -> TensorDescriptor | None:
    """A descriptor of ``[block_v, block_k]`` blocks over the rows of ``state [slots, H, V, K]``
    (contiguous) where ``wanted`` and the device takes one (CPU, or CUDA sm_90 and later),
    else ``None`` (the kernels then load through pointers). Also ``None`` past ``2**31`` rows,
    which a descriptor's int32 coordinates cannot reach."""
    if not wanted or state.numel() // state.shape[-1] >= 2**31:
        return None
    if state.device.type == "cuda" and not is_hopper_or_later(state.device):
        return None
    return TensorDescriptor.from_tensor(state.view(-1, state.shape[-1]), [block_v, block_k])
