"""Commit, the fold-operand-once design: the fold operand built once, then the state kernel.

For many (row, head) pairs (docs/design.md §9), two launches:
``_commit_fold_operand_kernel``, one program per (row, head, block of key channels), writes
``F`` of the commit length (operand 0) and, on rows with a boundary slot, of the recovery
length (operand 1) once; then ``_commit_fold_state_kernel`` walks each state tile in blocks of
key channels (loads pipelined) and stores each block folded. ``fold-operand-once-wide`` gives
each operand program 64 key channels, not 32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.commit.fold import fold_state_block, recorded_corrections, store_fold_operand
from kernels.commit.row import CommitCall, commit_row, slot_tile
from kernels.dependent_launch import dependent_launch, start_tile_head_row
from kernels.launch import DOT_PRECISION, CommitConfig
from kernels.triton_math import NULL_SLOT, head_decay_rate, record_key_inverse_norms


@triton.jit
def _commit_fold_operand_kernel(
    key_gate_ptr, gate, fold_operands, state_indices_ptr, record_indices_ptr, plan, stride_state_indices,
    operand_stride,
    H: tl.constexpr, K: tl.constexpr, T: tl.constexpr, BK: tl.constexpr, BKK: tl.constexpr, BT: tl.constexpr,
    HAS_LOWER_BOUND: tl.constexpr, HAS_RECORD_INDICES: tl.constexpr, DEPENDENT: tl.constexpr,
):
    """Per (block of ``BKK`` key channels, head, row): operand 0 folds the commit length,
    operand 1 (boundary rows only) the recovery length. Operand ``o`` of pair ``p`` is at
    ``o * operand_stride + p`` in units of one pair's ``fold [BT, K]`` and ``decay [K]``."""
    A_log_ptr, dt_bias_ptr, lower_bound = gate
    fold_ptr, decay_ptr = fold_operands
    part, h, b = start_tile_head_row(DEPENDENT)
    n, _, rec, folds, _, _, _, has_boundary, recovery = commit_row(
        plan, state_indices_ptr, record_indices_ptr, b, stride_state_indices, NULL_SLOT, T, HAS_RECORD_INDICES)
    if folds:
        offs_t = tl.arange(0, BT)
        kg_rows = key_gate_ptr + ((rec * H + h) * T + offs_t[:, None]) * (2 * K)
        dt_bias_row = dt_bias_ptr + h * K
        A_h = head_decay_rate(A_log_ptr, h)
        pair = (b * H + h).to(tl.int64)
        key_inverse_norm = record_key_inverse_norms(kg_rows, offs_t < n, K, BK, BKK)  # recovery <= n
        store_fold_operand(kg_rows, n, key_inverse_norm, dt_bias_row, A_h, lower_bound,
                           fold_ptr + (pair * BT + offs_t[:, None]) * K, decay_ptr + pair * K, part * BKK,
                           K, BKK, BKK, BT, HAS_LOWER_BOUND)
        if has_boundary:
            pair += operand_stride
            store_fold_operand(kg_rows, recovery, key_inverse_norm, dt_bias_row, A_h, lower_bound,
                               fold_ptr + (pair * BT + offs_t[:, None]) * K, decay_ptr + pair * K, part * BKK,
                               K, BKK, BKK, BT, HAS_LOWER_BOUND)


@triton.jit
def _commit_fold_state_kernel(
    state_ptr, correction_ptr, fold_operands, state_indices_ptr, record_indices_ptr, plan, stride_state_indices,
    operand_stride,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr,
    BK: tl.constexpr, BKK: tl.constexpr, BOUNDARY_BKK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    FOLD_DEPTH: tl.constexpr, STAGES: tl.constexpr, HAS_RECORD_INDICES: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DEPENDENT: tl.constexpr,
):
    """Per (V-tile, head, row): the operands of ``_commit_fold_operand_kernel`` applied to each block."""
    fold_ptr, decay_ptr = fold_operands
    pid_v, h, b = start_tile_head_row(DEPENDENT)
    n, source, rec, folds, final, has_final, boundary, has_boundary, recovery = commit_row(
        plan, state_indices_ptr, record_indices_ptr, b, stride_state_indices, NULL_SLOT, T, HAS_RECORD_INDICES)
    if folds:
        offs_v = pid_v * BV + tl.arange(0, BV)
        mask_v = (offs_v < V)[:, None]
        offs_f = tl.arange(0, FOLD_DEPTH)
        pair = (b * H + h).to(tl.int64)
        correction_cols = correction_ptr + ((rec * H + h) * T + offs_f[None, :]) * V + offs_v[:, None]
        corrections = recorded_corrections(correction_cols, offs_f, n, mask_v)
        fold_rows = fold_ptr + (pair * BT + offs_f[:, None]) * K
        decay_row = decay_ptr + pair * K
        source_rows = slot_tile(state_ptr, source, h, offs_v, H, V, K)
        final_rows = slot_tile(state_ptr, final, h, offs_v, H, V, K)
        dtype = state_ptr.dtype.element_ty
        if has_boundary:
            boundary_rows = slot_tile(state_ptr, boundary, h, offs_v, H, V, K)
            recovered = pair + operand_stride
            boundary_corrections = recorded_corrections(correction_cols, offs_f, recovery, mask_v)
            boundary_fold_rows = fold_ptr + (recovered * BT + offs_f[:, None]) * K
            for c0 in tl.range(0, BK, BOUNDARY_BKK, num_stages=STAGES):
                cols = c0 + tl.arange(0, BOUNDARY_BKK)
                mask_vc = mask_v & (cols < K)[None, :]
                S = tl.load(source_rows + cols[None, :], mask=mask_vc, other=0.0)
                tl.store(boundary_rows + cols[None, :],
                         fold_state_block(S, boundary_corrections, boundary_fold_rows, decay_ptr + recovered * K,
                                          offs_f, cols, True, K, BT, DOT_PRECISION).to(dtype), mask=mask_vc)
                tl.store(final_rows + cols[None, :],
                         fold_state_block(S, corrections, fold_rows, decay_row, offs_f, cols, True, K, BT,
                                          DOT_PRECISION).to(dtype), mask=mask_vc & has_final)
        elif has_final:
            for k0 in tl.range(0, BK, BKK, num_stages=STAGES):
                offs_k = k0 + tl.arange(0, BKK)
                mask_vk = mask_v & (offs_k < K)[None, :]
                S = tl.load(source_rows + offs_k[None, :], mask=mask_vk, other=0.0)
                folded = fold_state_block(S, corrections, fold_rows, decay_row, offs_f, offs_k, True, K, BT,
                                          DOT_PRECISION)
                tl.store(final_rows + offs_k[None, :], folded.to(dtype), mask=mask_vk)


def launch_fold_operand_once(call: CommitCall, cfg: CommitConfig) -> None:
    """The fold-operand launch, then the fold state kernel, on ``cfg``'s tiles."""
    B, H, K = call.B, call.H, call.K
    f32 = dict(dtype=torch.float32, device=call.state.device)
    # operand 0: the commit length; 1: the recovery length
    fold_operands = (torch.empty((2, B, H, cfg.block_t, K), **f32), torch.empty((2, B, H, K), **f32))
    dependent = dependent_launch(call.state.device)
    _commit_fold_operand_kernel[(triton.cdiv(K, cfg.operand_block_k), H, B)](
        call.records.key_gate, call.gate(), fold_operands, call.state_indices, call.record_indices, call.plan_rows,
        call.state_indices.stride(0), B * H, BK=cfg.block_k, BKK=cfg.operand_block_k, BT=cfg.block_t,
        **call.shape_options(), **dependent, num_warps=1, num_stages=1,
    )
    _commit_fold_state_kernel[(triton.cdiv(call.V, cfg.block_v), H, B)](
        call.state, call.records.correction, fold_operands, call.state_indices, call.record_indices, call.plan_rows,
        call.state_indices.stride(0), B * H, V=call.V, BK=cfg.block_k, BKK=cfg.block_kk,
        BOUNDARY_BKK=cfg.boundary_block_kk, BV=cfg.block_v, BT=cfg.block_t, FOLD_DEPTH=cfg.fold_depth,
        STAGES=cfg.stages, DOT_PRECISION=DOT_PRECISION, H=H, K=K, T=call.T,
        HAS_RECORD_INDICES=call.record_indices is not None, **dependent, num_warps=cfg.num_warps, num_stages=1,
    )
