"""RecoverSSM commit: fold recorded tokens into checkpoint slots (docs/design.md §3, §6).

Folding is ``S_n = S_0 exp(G_n) + U F_n`` (``kernels.fold``), whose operand ``F_n`` depends on
a row's records alone, not on the state. Three designs, chosen by the number of (row, head)
pairs and the window (``kernels.launch.commit_config``):

- fewest tokens: ``_commit_token_loop_kernel``, one program per (V-tile, row, head), holds a
  whole ``[BV, K]`` state tile and folds the records one token at a time (the recurrence of
  docs/design.md §2): elementwise work, no product and no operand;
- few pairs, one launch: ``_commit_fold_in_tile_kernel``, one program per (V-tile, row, head),
  rebuilds each block of ``F`` from the records beside the state block, in every V-tile;
- many pairs, two launches: ``_commit_fold_operand_kernel``, one program per (row, head, block of
  key channels), writes ``F`` of the commit length (operand 0) and, on rows with a boundary
  slot, of the recovery length (operand 1) once; then ``_commit_fold_state_kernel`` walks each
  state tile in blocks of key channels (loads pipelined) and stores each block folded.

Kernels take their related pointers as tuples: ``records = (key_gate, correction)``,
``gate = (A_log, dt_bias, lower_bound)``, ``plan`` (the ``CommitPlan``'s four row pointers in
its field order) and ``fold_operands = (fold, decay)``.

Rows with a boundary slot take both folds from one read of each block (the boundary slot may
be the source), in narrower blocks of ``BOUNDARY_BKK`` so that this rarer path does not set
the kernel's register count. Records past a fold's length are masked out before they are
read, so NaN there is inert.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.buffers import CommitPlan, KDARecoverSSMRecords
from kernels.contract import check_commit_args
from kernels.dependent_launch import (
    await_prior_grid, dependent_launch, release_next_grid,
)
from kernels.flush_plan import planned_flush_count
from kernels.fold import fold_recorded_token, fold_state_block, recorded_corrections, store_fold_operand
from kernels.launch import DOT_PRECISION, Target, commit_config
from kernels.triton_math import NULL_SLOT, fold_operand, record_key_inverse_norms, record_keys_and_gates, record_row


@triton.jit
def _commit_row(plan, state_indices_ptr, record_indices_ptr, b, stride_state_indices, T: tl.constexpr,
                HAS_RECORD_INDICES: tl.constexpr):
    """Row ``b``'s plan as every commit kernel reads it: ``(n, source, record row, folds,
    final, has_final, boundary, has_boundary, recovery)``, slots int64; nothing is folded
    unless ``folds``, a slot is written only where its ``has_*`` holds. ``plan``: the
    ``CommitPlan``'s four row pointers, in its field order."""
    commit_lens_ptr, final_state_indices_ptr, boundary_state_indices_ptr, boundary_recovery_lens_ptr = plan
    n = tl.minimum(tl.load(commit_lens_ptr + b), T)
    source = tl.load(state_indices_ptr + b * stride_state_indices).to(tl.int64)
    rec = record_row(record_indices_ptr, b, HAS_RECORD_INDICES)
    final = tl.load(final_state_indices_ptr + b).to(tl.int64)
    boundary = tl.load(boundary_state_indices_ptr + b).to(tl.int64)
    recovery = tl.load(boundary_recovery_lens_ptr + b)
    has_boundary = (boundary > NULL_SLOT) & (recovery > 0) & (recovery <= n)
    folds = (n > 0) & (source > NULL_SLOT) & (rec >= 0)
    return n, source, rec, folds, final, final > NULL_SLOT, boundary, has_boundary, recovery


@triton.jit
def _slot_tile(state_ptr, slot, h, offs_v, H: tl.constexpr, V: tl.constexpr, K: tl.constexpr):
    """``[BV, 1]`` pointers to rows ``offs_v`` of head ``h`` of checkpoint slot ``slot``."""
    return state_ptr + slot * (H * V * K) + (h * V + offs_v[:, None]) * K


# One launch, for few (row, head) pairs.


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
    await_prior_grid(DEPENDENT)
    release_next_grid(DEPENDENT)
    pid_v = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    n, source, rec, folds, final, has_final, boundary, has_boundary, recovery = _commit_row(
        plan, state_indices_ptr, record_indices_ptr, b, stride_state_indices, T, HAS_RECORD_INDICES)
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
        A_h = tl.exp(tl.load(A_log_ptr + h))
        dt_bias_row = dt_bias_ptr + h * K
        source_rows = _slot_tile(state_ptr, source, h, offs_v, H, V, K)
        final_rows = _slot_tile(state_ptr, final, h, offs_v, H, V, K)
        dtype = state_ptr.dtype.element_ty
        if has_boundary:
            boundary_rows = _slot_tile(state_ptr, boundary, h, offs_v, H, V, K)
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


@triton.jit
def _commit_token_loop_kernel(
    state_ptr, records, gate, state_indices_ptr, record_indices_ptr, plan, pending_ptr, stride_state_indices,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HAS_LOWER_BOUND: tl.constexpr, HAS_RECORD_INDICES: tl.constexpr, PENDING: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    """Per (V-tile, head, row): the whole ``[BV, BK]`` state tile in registers, folded one
    recorded token at a time (``fold_recorded_token``); the state after ``recovery`` tokens
    goes to the boundary slot, after ``n`` to the final one. Each token's work is elementwise
    over the tile but for its key's norm, and nothing is stored before the last token, so
    every token's loads can go out at once.

    With ``PENDING`` the plan is not read: each row folds its pending count (``pending``
    at its record row, as a flush plans it) into its own slot in place, and neither consumes
    the count nor writes a plan row (``fold_pending``)."""
    key_gate_ptr, correction_ptr = records
    A_log_ptr, dt_bias_ptr, lower_bound = gate
    await_prior_grid(DEPENDENT)
    release_next_grid(DEPENDENT)
    pid_v = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    if PENDING:
        source = tl.load(state_indices_ptr + b * stride_state_indices).to(tl.int64)
        rec = record_row(record_indices_ptr, b, HAS_RECORD_INDICES)
        owned = (source > NULL_SLOT) & (rec >= 0)
        n = planned_flush_count(tl.load(pending_ptr + rec, mask=owned, other=0), T)
        # every record of an owned row is read whatever its count, so no load waits for it
        folds, read_count = owned, T
        final, has_final = source, n > 0
        # no boundary slot, its names bound all the same: compiled, a plain False is a tensor,
        # so the boundary branch below is still generated
        boundary, has_boundary, recovery = source, False, 0
    else:
        n, source, rec, folds, final, has_final, boundary, has_boundary, recovery = _commit_row(
            plan, state_indices_ptr, record_indices_ptr, b, stride_state_indices, T, HAS_RECORD_INDICES)
        read_count = n
    if folds:
        offs_v = pid_v * BV + tl.arange(0, BV)
        offs_k = tl.arange(0, BK)
        mask_vk = (offs_v < V)[:, None] & (offs_k < K)[None, :]
        tile = (h * V + offs_v[:, None]) * K + offs_k[None, :]
        S = tl.load(state_ptr + source * (H * V * K) + tile, mask=mask_vk, other=0.0).to(tl.float32)
        A_h = tl.exp(tl.load(A_log_ptr + h))
        dt_bias = tl.load(dt_bias_ptr + h * K + offs_k, mask=offs_k < K, other=0.0)
        first = (rec * H + h) * T
        dtype = state_ptr.dtype.element_ty
        if has_boundary:
            S_boundary = S
            for t in tl.static_range(T):
                S = fold_recorded_token(S, key_gate_ptr, correction_ptr, first, t, t < n, t < read_count, offs_k,
                                        offs_v, dt_bias, A_h, lower_bound, K, V, HAS_LOWER_BOUND)
                S_boundary = tl.where(recovery == t + 1, S, S_boundary)
            tl.store(state_ptr + boundary * (H * V * K) + tile, S_boundary.to(dtype), mask=mask_vk)
        else:
            for t in tl.static_range(T):
                S = fold_recorded_token(S, key_gate_ptr, correction_ptr, first, t, t < n, t < read_count, offs_k,
                                        offs_v, dt_bias, A_h, lower_bound, K, V, HAS_LOWER_BOUND)
        tl.store(state_ptr + final * (H * V * K) + tile, S.to(dtype),
                 mask=(offs_v < V)[:, None] & (offs_k < tl.where(has_final, K, 0))[None, :])


# Two launches, for many.


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
    await_prior_grid(DEPENDENT)
    release_next_grid(DEPENDENT)
    part = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    n, _, rec, folds, _, _, _, has_boundary, recovery = _commit_row(
        plan, state_indices_ptr, record_indices_ptr, b, stride_state_indices, T, HAS_RECORD_INDICES)
    if folds:
        offs_t = tl.arange(0, BT)
        kg_rows = key_gate_ptr + ((rec * H + h) * T + offs_t[:, None]) * (2 * K)
        dt_bias_row = dt_bias_ptr + h * K
        A_h = tl.exp(tl.load(A_log_ptr + h))
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
    await_prior_grid(DEPENDENT)
    release_next_grid(DEPENDENT)
    pid_v = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    n, source, rec, folds, final, has_final, boundary, has_boundary, recovery = _commit_row(
        plan, state_indices_ptr, record_indices_ptr, b, stride_state_indices, T, HAS_RECORD_INDICES)
    if folds:
        offs_v = pid_v * BV + tl.arange(0, BV)
        mask_v = (offs_v < V)[:, None]
        offs_f = tl.arange(0, FOLD_DEPTH)
        pair = (b * H + h).to(tl.int64)
        correction_cols = correction_ptr + ((rec * H + h) * T + offs_f[None, :]) * V + offs_v[:, None]
        corrections = recorded_corrections(correction_cols, offs_f, n, mask_v)
        fold_rows = fold_ptr + (pair * BT + offs_f[:, None]) * K
        decay_row = decay_ptr + pair * K
        source_rows = _slot_tile(state_ptr, source, h, offs_v, H, V, K)
        final_rows = _slot_tile(state_ptr, final, h, offs_v, H, V, K)
        dtype = state_ptr.dtype.element_ty
        if has_boundary:
            boundary_rows = _slot_tile(state_ptr, boundary, h, offs_v, H, V, K)
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


def kda_recoverssm_commit(checkpoint_state, records: KDARecoverSSMRecords, A_log, dt_bias, lower_bound,
                          state_indices, plan: CommitPlan, record_indices=None) -> None:
    """Fold each row's first ``plan.commit_lens[b]`` records, read at record row
    ``record_indices[b]`` (or ``b``), from slot ``state_indices[b]`` into
    ``plan.final_state_indices[b]`` and, after ``plan.boundary_recovery_lens[b]`` records,
    into ``plan.boundary_state_indices[b]``. Rows with no records to fold are untouched.
    """
    B, H, K, V = check_commit_args(checkpoint_state, records, A_log, dt_bias, state_indices, plan, record_indices)
    if B == 0:
        return
    T = records.spec_query_len
    cfg = commit_config(B, H, K, V, T, Target.of(checkpoint_state.device))
    has_rec = record_indices is not None
    dependent = dependent_launch(checkpoint_state.device)
    plan_rows = (plan.commit_lens, plan.final_state_indices, plan.boundary_state_indices, plan.boundary_recovery_lens)
    gate = _gate(A_log, dt_bias, lower_bound)
    args = dict(H=H, K=K, V=V, T=T, BK=cfg.block_k, BKK=cfg.block_kk, BOUNDARY_BKK=cfg.boundary_block_kk,
                BV=cfg.block_v, STAGES=cfg.stages, HAS_RECORD_INDICES=has_rec, DOT_PRECISION=DOT_PRECISION,
                **dependent, num_warps=cfg.num_warps, num_stages=1)
    state_grid = (triton.cdiv(V, cfg.block_v), H, B)
    if cfg.design == "token-loop":
        _launch_token_loop(cfg, checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices,
                           record_indices, plan_rows, None)
        return
    if cfg.design == "fold-in-tile":
        _commit_fold_in_tile_kernel[state_grid](
            checkpoint_state, (records.key_gate, records.correction), gate, state_indices, record_indices, plan_rows,
            state_indices.stride(0), BT=cfg.fold_depth, HAS_LOWER_BOUND=lower_bound is not None, **args,
        )
        return
    f32 = dict(dtype=torch.float32, device=checkpoint_state.device)
    parts = triton.cdiv(K, cfg.operand_block_k)
    # operand 0: the commit length; 1: the recovery length
    fold = torch.empty((2, B, H, cfg.block_t, K), **f32)
    decay = torch.empty((2, B, H, K), **f32)
    _commit_fold_operand_kernel[(parts, H, B)](
        records.key_gate, gate, (fold, decay), state_indices, record_indices, plan_rows, state_indices.stride(0),
        B * H,
        H=H, K=K, T=T, BK=cfg.block_k, BKK=cfg.operand_block_k, BT=cfg.block_t,
        HAS_LOWER_BOUND=lower_bound is not None, HAS_RECORD_INDICES=has_rec, **dependent,
        num_warps=1, num_stages=1,
    )
    _commit_fold_state_kernel[state_grid](
        checkpoint_state, records.correction, (fold, decay), state_indices, record_indices, plan_rows,
        state_indices.stride(0), B * H, BT=cfg.block_t, FOLD_DEPTH=cfg.fold_depth, **args,
    )


def _gate(A_log, dt_bias, lower_bound) -> tuple:
    """The kernels' ``gate`` argument (``lower_bound`` 0 where there is none: ``HAS_LOWER_BOUND`` false)."""
    return A_log, dt_bias, 0.0 if lower_bound is None else float(lower_bound)


def fold_pending(checkpoint_state, records: KDARecoverSSMRecords, A_log, dt_bias, lower_bound, state_indices,
                 record_rows, pending) -> None:
    """Fold each row's pending records (``pending[record_rows[b]]`` of them, as a flush plans
    the count) into its slot in place, in one launch of the commit's token loop on its tiles
    for ``B`` rows. Unlike ``kda_recoverssm_flush``
    it neither consumes the counts nor writes a plan: the caller's next launch must (the
    flushing verify's flush apart). Arguments as ``kda_recoverssm_flush``'s, already checked."""
    B, H, V, K = state_indices.shape[0], checkpoint_state.shape[1], checkpoint_state.shape[2], checkpoint_state.shape[3]
    cfg = commit_config(B, H, K, V, records.spec_query_len, Target.of(checkpoint_state.device), design="token-loop")
    _launch_token_loop(cfg, checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, record_rows,
                       (None,) * 4, pending)


def _launch_token_loop(cfg, checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, record_indices,
                       plan_rows, pending) -> None:
    """The commit's token loop over ``plan_rows``, or with ``pending`` counts instead (``PENDING``)."""
    H, V, K = checkpoint_state.shape[1], checkpoint_state.shape[2], checkpoint_state.shape[3]
    _commit_token_loop_kernel[(triton.cdiv(V, cfg.block_v), H, state_indices.shape[0])](
        checkpoint_state, (records.key_gate, records.correction), _gate(A_log, dt_bias, lower_bound), state_indices,
        record_indices, plan_rows, pending, state_indices.stride(0),
        H=H, K=K, V=V, T=records.spec_query_len, BK=cfg.block_k, BV=cfg.block_v,
        HAS_LOWER_BOUND=lower_bound is not None, HAS_RECORD_INDICES=record_indices is not None,
        PENDING=pending is not None, **dependent_launch(checkpoint_state.device), num_warps=1,
        maxnreg=cfg.max_registers, num_stages=1,
    )
