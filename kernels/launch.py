"""Launch configuration: tile sizes and warps per kernel, chosen from the problem shape.

Kept apart from the kernels so that tuning touches one file. Shapes only, never values:
a configuration never needs a host synchronisation.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton

DOT_PRECISION = "tf32x3"
"""Products with the state: split-precision tf32 (three passes) keeps float32 accuracy."""

_DOT_MIN = 16  # tl.dot needs every dimension >= 16

_FACTORED_LOG_RANGE = 80.0
"""Largest window log decay ``|G|`` for which ``exp(G)`` and ``exp(-G)`` are both finite in float32."""


@dataclass(frozen=True)
class TileConfig:
    """``block_*``: tile sizes; ``chunks_v``: V-tiles one program walks through in turn, so
    that work independent of V (keys, gates, the T x T solve) is done once per chunk group."""

    block_k: int
    block_v: int
    block_t: int
    num_warps: int
    chunks_v: int = 1


def verify_config(batch: int, heads: int, head_k_dim: int, head_v_dim: int, spec_query_len: int) -> TileConfig:
    block_k = max(_DOT_MIN, triton.next_power_of_2(head_k_dim))
    block_t = max(_DOT_MIN, triton.next_power_of_2(spec_query_len))
    block_v = max(_DOT_MIN, min(64, triton.next_power_of_2(head_v_dim)))
    chunks_v = min(2, triton.cdiv(head_v_dim, block_v))
    return TileConfig(block_k, block_v, block_t, num_warps=4, chunks_v=chunks_v)


def commit_config(batch: int, heads: int, head_k_dim: int, head_v_dim: int, spec_query_len: int) -> TileConfig:
    block_v = min(16, triton.next_power_of_2(head_v_dim))
    return TileConfig(triton.next_power_of_2(head_k_dim), block_v, spec_query_len, num_warps=1)


def factored_window(lower_bound: float | None, spec_query_len: int) -> bool:
    """Whether verify may factor ``exp(G_t - G_j)`` as ``exp(G_t) exp(-G_j)``: only when a
    lower bound caps each token's log decay, so that the window's stays in float32 range."""
    return lower_bound is not None and spec_query_len * abs(lower_bound) <= _FACTORED_LOG_RANGE
