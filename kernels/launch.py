"""Launch configuration: tile sizes and warps per kernel, chosen from the problem shape.

Kept apart from the kernels so that tuning touches one file. Shapes only, never values:
a configuration never needs a host synchronisation.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton


@dataclass(frozen=True)
class TileConfig:
    """Tile sizes (state rows ``block_v``, key channels ``block_k``, window ``block_t``) and warps."""

    block_k: int
    block_v: int
    block_t: int
    num_warps: int


def verify_config(batch: int, heads: int, head_k_dim: int, head_v_dim: int, spec_query_len: int) -> TileConfig:
    """Whole heads (up to 128 state rows) per program: the key-side work is done once per head."""
    block_v = min(128, triton.next_power_of_2(head_v_dim))
    return TileConfig(triton.next_power_of_2(head_k_dim), block_v, triton.next_power_of_2(spec_query_len),
                      num_warps=8 if block_v >= 128 else 4)


def commit_config(batch: int, heads: int, head_k_dim: int, head_v_dim: int, spec_query_len: int) -> TileConfig:
    """Narrow one-warp tiles: the forward fold is elementwise, and many small programs keep
    the most state reads in flight (measured on an H200; benchmarks/NOTES.md)."""
    block_v = min(16, triton.next_power_of_2(head_v_dim))
    return TileConfig(triton.next_power_of_2(head_k_dim), block_v, spec_query_len, num_warps=1)
