"""Verify, the two-kernel design: the key side once per (row, head), then the state kernel.

1. ``_verify_key_side_kernel``, one program per (row, head), does everything that does not
   touch the state, in one pass over the key channels: it writes the row's key records, the
   stacked operand ``[W; P]`` built from the raw keys and queries, the norms that normalise
   its rows (known only after the last channel, ``row_scale``), and the mixing matrix ``M``
   (``kernels.verify.window``).
2. ``_verify_state_kernel``, one program per (V-tile, row, head), reads its state tile once:
   ``Y = S_0 [W; P]^T`` (scaled by ``row_scale``) and ``[U | O] = [V - S_0 W^T | S_0 P^T] M``.

Both walk the key channels in blocks (the state kernel as a pipelined loop of products), so
that no program holds a whole ``[T, K]`` or ``[BV, K]`` tile in registers and many programs
run per SM with their state reads overlapping. The key side issues a block's loads before
the previous block's stores (which, for all the compiler knows, may alias them), and the
state kernel loads its other inputs before its state blocks.

Its flushing form (``FLUSH``): a second key-side program per (row, head) builds the fold
operand of the row's pending records (``kernels.commit.fold``) before this window's records
overwrite them, and the state kernel folds each state block with it, stores the block in
place and takes the window's products from it: a deferred step reads each slot once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.commit.fold import fold_state_block, recorded_corrections, store_fold_operand
from kernels.dependent_launch import await_prior_grid, dependent_launch, start_tile_head_row
from kernels.launch import DOT_PRECISION, VerifyConfig, factored_window
from kernels.plan.flush_row import store_flush_plan
from kernels.triton_math import NULL_SLOT, head_decay_rate, record_key_inverse_norms, record_row
from kernels.verify.window import (
    VerifyCall, load_window_block, store_outputs, store_window_results, window_beta, window_block, window_inputs,
    window_mix, window_row,
)


@triton.jit
def _store_key_records(k_rows, g_rows, kg_rows, live, K: tl.constexpr, BK: tl.constexpr, BKK: tl.constexpr):
    """Copy the window's raw keys and gates (``[BT, 1]`` row pointers each) into its key
    records, ``live`` rows only; each block's loads go out before the previous block's stores."""
    offs = tl.arange(0, BKK)
    mask_tk = live[:, None] & (offs < K)[None, :]
    keys = tl.load(k_rows + offs[None, :], mask=mask_tk)
    gates = tl.load(g_rows + offs[None, :], mask=mask_tk)
    for k0 in tl.static_range(0, BK, BKK):
        offs_k = k0 + offs
        mask_tk = live[:, None] & (offs_k < K)[None, :]
        if k0 + BKK < BK:
            mask_next = live[:, None] & (offs_k + BKK < K)[None, :]
            next_keys = tl.load(k_rows + BKK + offs_k[None, :], mask=mask_next)
            next_gates = tl.load(g_rows + BKK + offs_k[None, :], mask=mask_next)
        tl.store(kg_rows + offs_k[None, :], keys, mask=mask_tk)
        tl.store(kg_rows + K + offs_k[None, :], gates, mask=mask_tk)
        if k0 + BKK < BK:
            keys, gates = next_keys, next_gates


@triton.jit
def _verify_key_side_kernel(
    tokens, token_strides, gate, key_gate_ptr, window_operands, fold_operands, pending_ptr, plan, rows,
    stride_state_indices,
    H: tl.constexpr, K: tl.constexpr, T: tl.constexpr, BK: tl.constexpr, BKK: tl.constexpr,
    BT: tl.constexpr, HAS_LOWER_BOUND: tl.constexpr, HAS_RECORD_INDICES: tl.constexpr,
    FACTORED: tl.constexpr, FLUSH: tl.constexpr, DOT_PRECISION: tl.constexpr, DEPENDENT: tl.constexpr,
):
    """Per (head, row): key records, ``operand [2 BT, K]`` (rows ``W`` then ``P``, each
    ``BT`` rows, zero past the window, before normalisation), ``row_scale [2 BT]`` (the
    factor that normalises each operand row) and ``mix [2 BT, 2 BT]``.

    Walks the key channels once, in blocks of ``BKK`` (``A`` and ``C`` are sums over the
    channels). Gates and decays are ``[BT, BKK]`` tiles; keys and queries are stacked so
    that ``[A; C]`` is one product.

    With ``FLUSH`` the grid has a second program per (row, head), ``program_id(2) == 1``,
    that owns the key records: it writes the flush plan's row ``b`` (head 0; the count stays
    in ``pending`` for the state kernel to consume), the fold operand of the row's pending
    records (``store_fold_operand``), then overwrites those records with the window's.

    It never releases the state kernel early (``kernels.dependent_launch``): that launches as
    the key side's programs exit.
    """
    q_ptr, k_ptr, g_ptr, v_ptr, beta_ptr, out_ptr = tokens
    stride_q_tok, stride_k_tok, stride_g_tok, stride_v_tok, stride_beta_tok, stride_out_tok = token_strides
    A_log_ptr, dt_bias_ptr, lower_bound = gate
    query_start_loc_ptr, state_indices_ptr, record_indices_ptr = rows
    commit_lens_ptr, final_state_indices_ptr, boundary_state_indices_ptr, boundary_recovery_lens_ptr = plan
    operand_ptr, row_scale_ptr, mix_ptr = window_operands
    fold_ptr, decay_ptr = fold_operands
    await_prior_grid(DEPENDENT)
    h = tl.program_id(0)
    b = tl.program_id(1)

    start, length, slot = window_row(query_start_loc_ptr, state_indices_ptr, b, stride_state_indices, T)
    rec = record_row(record_indices_ptr, b, HAS_RECORD_INDICES)
    if tl.program_id(2) == 1:
        if FLUSH:
            owned = (slot > NULL_SLOT) & (rec >= 0)
            # kda_recoverssm_flush's plan, row b written once (by head 0)
            pending = store_flush_plan(b, h == 0, slot, tl.load(pending_ptr + rec, mask=owned, other=0),
                                       commit_lens_ptr, final_state_indices_ptr, boundary_state_indices_ptr,
                                       boundary_recovery_lens_ptr, NULL_SLOT, T)
            offs_t = tl.arange(0, BT)
            kg_rows = key_gate_ptr + ((rec * H + h) * T + offs_t[:, None]) * (2 * K)
            if pending > 0:
                pair = (b * H + h).to(tl.int64)
                store_fold_operand(kg_rows, pending, record_key_inverse_norms(kg_rows, offs_t < pending, K, BK, BKK),
                                   dt_bias_ptr + h * K, head_decay_rate(A_log_ptr, h), lower_bound,
                                   fold_ptr + (pair * BT + offs_t[:, None]) * K, decay_ptr + pair * K, 0,
                                   K, BK, BKK, BT, HAS_LOWER_BOUND)
                tl.debug_barrier()  # every lane has read the old records before any is overwritten
            if owned & (length > 0):
                tok = start + offs_t[:, None]
                _store_key_records(k_ptr + tok * stride_k_tok + h * K, g_ptr + tok * stride_g_tok + h * K, kg_rows,
                                   offs_t < length, K, BK, BKK)
    elif (length > 0) & (slot > NULL_SLOT):
        offs_t = tl.arange(0, BT)
        live = offs_t < length
        tok = start + offs_t[:, None]
        k_rows = k_ptr + tok * stride_k_tok + h * K
        q_rows = q_ptr + tok * stride_q_tok + h * K
        g_rows = g_ptr + tok * stride_g_tok + h * K
        kg_rows = key_gate_ptr + ((rec * H + h) * T + offs_t[:, None]) * (2 * K)
        pair = (b * H + h).to(tl.int64)
        offs_m = tl.arange(0, 2 * BT)
        live_m = offs_m < length
        operand_rows = operand_ptr + (pair * 2 * BT + offs_m[:, None]) * K

        A_h = head_decay_rate(A_log_ptr, h)
        if not FLUSH:  # (flushing, a register held across the loop spills under the key side's cap)
            beta = window_beta(beta_ptr, start, h, offs_m, live_m, stride_beta_tok)
        sum_sq = tl.zeros((2 * BT,), tl.float32)
        AC = tl.zeros((2 * BT, 2 * BT), tl.float32)
        k_raw, g_raw, q_raw, dt_bias = load_window_block(k_rows, g_rows, q_rows, dt_bias_ptr + h * K,
                                                          tl.arange(0, BKK), live, K)
        for k0 in tl.static_range(0, BK, BKK):
            offs_k = k0 + tl.arange(0, BKK)
            mask_k = offs_k < K
            mask_tk = live[:, None] & mask_k[None, :]
            # The next block's loads go out before this block's stores (not when flushing, where
            # the registers they hold would spill under the key side's cap).
            if k0 + BKK < BK and not FLUSH:
                k_next, g_next, q_next, dt_bias_next = load_window_block(
                    k_rows, g_rows, q_rows, dt_bias_ptr + h * K, offs_k + BKK, live, K)
            if not FLUSH:  # (with FLUSH the other program writes them, once the fold has read the old ones)
                if rec >= 0:
                    tl.store(kg_rows + offs_k[None, :], k_raw, mask=mask_tk)
                    tl.store(kg_rows + K + offs_k[None, :], g_raw, mask=mask_tk)
            WP, sum_sq, AC = window_block(k_raw, g_raw, q_raw, dt_bias, live, A_h, lower_bound, sum_sq, AC,
                                           T, BT, BKK, HAS_LOWER_BOUND, FACTORED, DOT_PRECISION)
            tl.store(operand_rows + offs_k[None, :], WP, mask=mask_k[None, :])
            if k0 + BKK < BK:
                if FLUSH:
                    k_raw, g_raw, q_raw, dt_bias = load_window_block(
                        k_rows, g_rows, q_rows, dt_bias_ptr + h * K, offs_k + BKK, live, K)
                else:
                    k_raw, g_raw, q_raw, dt_bias = k_next, g_next, q_next, dt_bias_next
        if FLUSH:
            beta = window_beta(beta_ptr, start, h, offs_m, live_m, stride_beta_tok)
        row_scale, mix = window_mix(AC, sum_sq, beta, K, T, BT, DOT_PRECISION)
        tl.store(row_scale_ptr + pair * 2 * BT + offs_m, row_scale)
        tl.store(mix_ptr + (pair * 2 * BT + offs_m[:, None]) * 2 * BT + offs_m[None, :], mix)


@triton.jit
def _verify_state_kernel(
    tokens, token_strides, state_ptr, window_operands, correction_ptr, fold_operands, pending_ptr, commit_lens_ptr,
    rows, stride_state_indices,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr,
    BK: tl.constexpr, BKK: tl.constexpr, BV: tl.constexpr, BM: tl.constexpr, FOLD_DEPTH: tl.constexpr,
    STAGES: tl.constexpr, HAS_RECORD_INDICES: tl.constexpr, FLUSH: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    """Per (V-tile, head, row): outputs and corrections. Column ``c`` of the ``[BV, BM]``
    tiles is token ``c``'s correction for ``c < BM / 2`` and token ``c - BM / 2``'s output after.
    ``S_0 [W; P]^T`` is accumulated over blocks of ``BKK`` state columns, loads pipelined,
    then its columns are scaled by ``row_scale``.

    The window's other inputs (``window_inputs``) are loaded before the state blocks, so
    that their latency overlaps the products'. With ``FLUSH``, each state block is first
    folded with the key side's fold operand and stored in place, one program of the row
    consumes its pending count, and those inputs are loaded after the blocks: held across
    the fold's loop, they would spill under its register cap."""
    q_ptr, k_ptr, g_ptr, v_ptr, beta_ptr, out_ptr = tokens
    stride_q_tok, stride_k_tok, stride_g_tok, stride_v_tok, stride_beta_tok, stride_out_tok = token_strides
    query_start_loc_ptr, state_indices_ptr, record_indices_ptr = rows
    operand_ptr, row_scale_ptr, mix_ptr = window_operands
    fold_ptr, decay_ptr = fold_operands
    pid_v, h, b = start_tile_head_row(DEPENDENT)

    start, length, slot = window_row(query_start_loc_ptr, state_indices_ptr, b, stride_state_indices, T)

    offs_v = pid_v * BV + tl.arange(0, BV)
    offs_c = tl.arange(0, BM)
    mask_v = offs_v[:, None] < V
    HALF: tl.constexpr = BM // 2
    rec = record_row(record_indices_ptr, b, HAS_RECORD_INDICES)
    if FLUSH:
        pending = tl.load(commit_lens_ptr + b)  # the window kernel's flush plan
        if (pid_v == 0) & (h == 0) & (slot > NULL_SLOT) & (rec >= 0):
            tl.store(pending_ptr + rec, 0)  # consumed, after every key-side program has read it
        active = (length > 0) | (pending > 0)
    else:
        active = length > 0
    if slot > NULL_SLOT:
        if active:
            pair = (b * H + h).to(tl.int64)
            state_rows = state_ptr + ((slot * H + h) * V + offs_v[:, None]) * K
            operand_cols = operand_ptr + (pair * BM + offs_c[None, :]) * K
            if FLUSH:
                folding = pending > 0
                offs_f = tl.arange(0, FOLD_DEPTH)
                pending_corrections = recorded_corrections(
                    correction_ptr + ((rec * H + h) * T + offs_f[None, :]) * V + offs_v[:, None], offs_f, pending,
                    mask_v)
                window_k = tl.where(length > 0, K, 0)  # a row without tokens has no operand written
            else:
                window_k = K
            if not FLUSH:
                row_scale, mix, values = window_inputs(row_scale_ptr, mix_ptr, v_ptr, pair, start, length, h,
                                                        offs_v, mask_v, stride_v_tok, V, BM)
            Y = tl.zeros((BV, BM), tl.float32)
            for k0 in tl.range(0, BK, BKK, num_stages=STAGES):
                offs_k = k0 + tl.arange(0, BKK)
                mask_vk = mask_v & (offs_k < K)[None, :]
                S = tl.load(state_rows + offs_k[None, :], mask=mask_vk, other=0.0)
                if FLUSH:
                    # the flush's fold of this block (docs/design.md §7), stored in place; the
                    # window then runs from the stored (rounded) state, as after a flush
                    S = fold_state_block(S, pending_corrections, fold_ptr + (pair * HALF + offs_f[:, None]) * K,
                                         decay_ptr + pair * K, offs_f, offs_k, folding, K, HALF,
                                         DOT_PRECISION).to(S.dtype)
                    tl.store(state_rows + offs_k[None, :], S, mask=mask_vk & folding)
                operand = tl.load(operand_cols + offs_k[:, None], mask=(offs_k < window_k)[:, None], other=0.0)
                Y = tl.dot(S.to(tl.float32), operand, Y, input_precision=DOT_PRECISION)
            if length > 0:
                if FLUSH:
                    row_scale, mix, values = window_inputs(row_scale_ptr, mix_ptr, v_ptr, pair, start, length, h,
                                                            offs_v, mask_v, stride_v_tok, V, BM)
                store_window_results(Y, row_scale, mix, values, out_ptr, correction_ptr, start, length, rec, h,
                                      offs_v, mask_v, stride_out_tok, H, V, T, BM, DOT_PRECISION)
    elif length > 0:
        store_outputs(tl.zeros((BV, BM), tl.float32), out_ptr, start, length, h, offs_v, mask_v, stride_out_tok,
                       V, BM)


def launch_two_kernels(call: VerifyCall, cfg: VerifyConfig, pending=None, plan_rows=(None,) * 4) -> None:
    """The key side, then the state kernel, on ``cfg``'s tiles; flushing with ``pending``
    counts (and the ``plan_rows`` that receive the flush plan)."""
    B, H, K, V = call.B, call.H, call.K, call.V
    flush = pending is not None
    device = call.v.device
    f32 = dict(dtype=torch.float32, device=device)
    operand = torch.empty((B, H, cfg.block_m, K), **f32)
    row_scale = torch.empty((B, H, cfg.block_m), **f32)
    mix = torch.empty((B, H, cfg.block_m, cfg.block_m), **f32)
    fold = torch.empty((B, H, cfg.block_t, K) if flush else (1,), **f32)
    decay = torch.empty((B, H, K) if flush else (1,), **f32)
    dependent = dependent_launch(device)
    tokens, token_strides, rows = call.tokens(), call.token_strides(), call.rows()
    _verify_key_side_kernel[(H, B, 2 if flush else 1)](
        tokens, token_strides, call.gate(), call.records.key_gate, (operand, row_scale, mix), (fold, decay), pending,
        plan_rows, rows, call.state_indices.stride(0),
        BK=cfg.block_k, BKK=cfg.block_kk, BT=cfg.block_t, FACTORED=factored_window(call.lower_bound, call.T),
        FLUSH=flush, DOT_PRECISION=DOT_PRECISION, **call.shape_options(),
        **dependent, num_warps=cfg.key_side_warps, num_stages=1, maxnreg=cfg.key_side_max_registers,
    )
    _verify_state_kernel[(triton.cdiv(V, cfg.block_v), H, B)](
        tokens, token_strides, call.state, (operand, row_scale, mix), call.records.correction, (fold, decay), pending,
        plan_rows[0], rows, call.state_indices.stride(0),
        H=H, K=K, V=V, T=call.T, BK=cfg.block_k, BKK=cfg.block_kk, BV=cfg.block_v, BM=cfg.block_m,
        FOLD_DEPTH=cfg.fold_depth, STAGES=cfg.stages, HAS_RECORD_INDICES=call.record_indices is not None,
        FLUSH=flush, DOT_PRECISION=DOT_PRECISION, **dependent, num_warps=cfg.num_warps,
        num_stages=1, maxnreg=cfg.max_registers,
    )
