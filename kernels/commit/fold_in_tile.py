"""Commit, the fold-in-tile design: one launch, each V-tile rebuilding the fold operand.

For few (row, head) pairs (docs/design.md §9): one program per (V-tile, row, head) rebuilds
each block of ``F`` from the records beside the state block (docs/design.md §3), in every
V-tile, so no program waits for another launch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.commit.fold import recorded_corrections
from kernels.commit.row import CommitCall, commit_row, slot_tile
from kernels.dependent_launch import dependent_launch, start_tile_head_row
from kernels.launch import DOT_PRECISION, CommitConfig
from kernels.triton_math import (
    NULL_SLOT, fold_operand, head_decay_rate, record_key_inverse_norms, record_keys_and_gates,
)


@triton.jit
def _column_block(source_rows, kg_rows, dt_bias_row, offs_k, mask_v, live, key_scale, A, lower_bound,
                  K: tl.constexpr, HAS_LOWER_BOUND: tl.constexpr):
    """Key channels ``offs_k [BKK]``: the state block ``S [BV, BKK]`` in float32, and the
    normalised keys and log decays ``[BT, BKK]`` of the records."""
    S = tl.load(source_rows + offs_k[None, :], mask=mask_v[:, None] & (offs_k < K)[None, :], other=0.0)
    key, g = record_keys_and_gates(kg_rows, offs_k, live, key_scale, dt_bias_row, A, lower_bound, K,
                                   HAS_LOWER_BOUND)
    return S.to(tl.float32), key, g


@triton.jit
def _folded(S, U, g, G, key, count, offs_t, DOT_PRECISION: tl.constexpr):
    """``S exp(G_count) + U F_count`` for one column block (``S [BV, BKK]``, ``U [BV, BT]``,
    ``G = cumsum(g)``)."""
    decay, fold = fold_operand(g, G, key, count, offs_t)
    return S * decay[None, :] + tl.dot(U, fold, input_precision=DOT_PRECISION)


@triton.jit
def _commit_fold_in_tile_kernel(
    state_ptr, records, gate, state_indices_ptr, record_indices_ptr, plan, stride_state_indices,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr,
    BK: tl.constexpr, BKK: tl.constexpr, BOUNDARY_BKK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    STAGES: tl.constexpr, HAS_LOWER_BOUND: tl.constexpr, HAS_RECORD_INDICES: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DEPENDENT: tl.constexpr,
):
    """Per (V-tile, head, row): each block of the fold operand rebuilt beside its state block."""
    key_gate_ptr, correction_ptr = records
    A_log_ptr, dt_bias_ptr, lower_bound = gate
    pid_v, h, b = start_tile_head_row(DEPENDENT)
    n, source, rec, folds, final, has_final, boundary, has_boundary, recovery = commit_row(
        plan, state_indices_ptr, record_indices_ptr, b, stride_state_indices, NULL_SLOT, T, HAS_RECORD_INDICES)
    if folds:
        offs_t = tl.arange(0, BT)
        offs_v = pid_v * BV + tl.arange(0, BV)
        mask_v = offs_v < V
        live = offs_t < n
        first = (rec * H + h) * T
        kg_rows = key_gate_ptr + (first + offs_t[:, None]) * (2 * K)
        key_scale = record_key_inverse_norms(kg_rows, live, K, BK, BKK)
        U = recorded_corrections(correction_ptr + (first + offs_t[None, :]) * V + offs_v[:, None], offs_t, n,
                                 mask_v[:, None])
        A_h = head_decay_rate(A_log_ptr, h)
        dt_bias_row = dt_bias_ptr + h * K
        source_rows = slot_tile(state_ptr, source, h, offs_v, H, V, K)
        final_rows = slot_tile(state_ptr, final, h, offs_v, H, V, K)
        dtype = state_ptr.dtype.element_ty
        if has_boundary:
            boundary_rows = slot_tile(state_ptr, boundary, h, offs_v, H, V, K)
            for c0 in tl.range(0, BK, BOUNDARY_BKK, num_stages=STAGES):
                cols = c0 + tl.arange(0, BOUNDARY_BKK)
                S_c, key_c, g_c = _column_block(source_rows, kg_rows, dt_bias_row, cols, mask_v, live, key_scale, A_h,
                                                lower_bound, K, HAS_LOWER_BOUND)
                G_c = tl.cumsum(g_c, axis=0)
                mask_vc = mask_v[:, None] & (cols < K)[None, :]
                tl.store(boundary_rows + cols[None, :],
                         _folded(S_c, U, g_c, G_c, key_c, recovery, offs_t, DOT_PRECISION).to(dtype), mask=mask_vc)
                tl.store(final_rows + cols[None, :],
                         _folded(S_c, U, g_c, G_c, key_c, n, offs_t, DOT_PRECISION).to(dtype), mask=mask_vc & has_final)
        elif has_final:
            for k0 in tl.range(0, BK, BKK, num_stages=STAGES):
                offs_k = k0 + tl.arange(0, BKK)
                S, key, g = _column_block(source_rows, kg_rows, dt_bias_row, offs_k, mask_v, live, key_scale, A_h,
                                          lower_bound, K, HAS_LOWER_BOUND)
                folded = _folded(S, U, g, tl.cumsum(g, axis=0), key, n, offs_t, DOT_PRECISION)
                tl.store(final_rows + offs_k[None, :], folded.to(dtype), mask=mask_v[:, None] & (offs_k < K)[None, :])


def launch_fold_in_tile(call: CommitCall, cfg: CommitConfig) -> None:
    """One launch of ``_commit_fold_in_tile_kernel`` on ``cfg``'s tiles."""
    _commit_fold_in_tile_kernel[(triton.cdiv(call.V, cfg.block_v), call.H, call.B)](
        call.state, call.record_tensors(), call.gate(), call.state_indices, call.record_indices, call.plan_rows,
        call.state_indices.stride(0), V=call.V, BK=cfg.block_k, BKK=cfg.block_kk,
        BOUNDARY_BKK=cfg.boundary_block_kk, BV=cfg.block_v, BT=cfg.fold_depth, STAGES=cfg.stages,
        DOT_PRECISION=DOT_PRECISION, **call.shape_options(), **dependent_launch(call.state.device),
        num_warps=cfg.num_warps, num_stages=1,
    )
