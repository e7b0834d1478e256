"""Verify, the token-loop design: the window one token at a time on a state tile held in registers.

For the fewest tokens (``kernels.launch``, docs/design.md §9): each program holds a
whole ``[BV, K]`` state tile and runs the recurrence of docs/design.md §2, two row
reductions a token and an elementwise update, with no matrix products and no operands to
build, so a program's chain is short where that chain is the whole time.

Its flushing forms: ``FLUSH`` (``token-loop-token-by-token``) first folds each row's pending
records into the tile and stores it back; ``CONSUME_PENDING``
(``flush-apart``, after ``kernels.commit.fold_pending``) consumes the counts and writes the
flush plan of a window that runs from the state that launch folded.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.commit.fold import fold_recorded_token
from kernels.dependent_launch import (
    arrive, arrived_last, dependent_launch, gpu_fence, row_counters, start_tile_head_row,
)
from kernels.launch import Target, VerifyConfig
from kernels.plan.flush_row import planned_flush_count, store_flush_plan
from kernels.triton_math import (
    NULL_SLOT, head_decay_rate, record_row, recurrence_step, tile_column, tile_row, token_key_and_decay, token_queries,
    vector_entry, write_strength,
)
from kernels.verify.window import VerifyCall, store_corrections, store_outputs, window_row


@triton.jit
def _verify_token_loop_kernel(
    tokens, token_strides, gate, state_ptr, records, rows, stride_state_indices, pending_ptr, plan, counters_ptr,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, BT: tl.constexpr, HAS_LOWER_BOUND: tl.constexpr, HAS_RECORD_INDICES: tl.constexpr,
    FLUSH: tl.constexpr, CONSUME_PENDING: tl.constexpr, WINDOW_AT_ONCE: tl.constexpr, FENCED: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    """Per (V-tile, head, row): the whole ``[BV, BK]`` state tile in registers, run through
    the window one token at a time (docs/design.md §2): two row reductions a token (the
    correction's ``S k^``, the output's ``S q^``) and an elementwise ``recurrence_step``, for
    few (row, head) pairs, where each program's chain sets the time. ``BT``: the window
    rounded up to a power of two.

    With ``WINDOW_AT_ONCE`` the window's keys, gates, queries, values and betas are read at
    once, as ``[BT, BK]`` (``[BV, BT]``) blocks, and each token takes its row (``tile_row``);
    otherwise each token reads its own, and its loads go out only after the previous token's
    reductions (warps issue in order, and the compiler sinks loads toward their use), with
    fewer registers held. Either way every load goes out before the first store (for all the
    compiler knows, they may alias): the key records are read up front and stored after the
    window with the outputs and corrections.

    With ``FLUSH`` each tile first folds the row's pending records (``fold_recorded_token``)
    and is stored back in place, rounded to the slot's dtype, and the window runs from it. The
    pending key records are read by every V-tile of a (row, head) before the window's
    overwrite them, and the pending count by every program of the row before it is cleared:
    so the last V-tile of a (row, head) to arrive after its reads writes the key records, and
    the last program of the row clears the count (``arrive`` on ``counters``: ``B * H`` for
    the (row, head) pairs, then ``B`` for the rows, zero between launches). Each program
    arrives right after its fold and reads the answers after the window, behind one
    ``gpu_fence`` each way (``FENCED``: compiled). The records are read whatever the count, so
    that their loads need not wait for it. The first program of a row writes its flush plan,
    last.

    With ``CONSUME_PENDING`` (the flush apart, ``fold_pending`` launched just before) the
    first program of each row consumes its pending count and writes its flush plan: the
    window runs from the state that launch folded."""
    q_ptr, k_ptr, g_ptr, v_ptr, beta_ptr, out_ptr = tokens
    stride_q_tok, stride_k_tok, stride_g_tok, stride_v_tok, stride_beta_tok, stride_out_tok = token_strides
    A_log_ptr, dt_bias_ptr, lower_bound = gate
    key_gate_ptr, correction_ptr = records
    query_start_loc_ptr, state_indices_ptr, record_indices_ptr = rows
    commit_lens_ptr, final_state_indices_ptr, boundary_state_indices_ptr, boundary_recovery_lens_ptr = plan
    pid_v, h, b = start_tile_head_row(DEPENDENT)
    BM: tl.constexpr = 2 * BT

    start, length, slot = window_row(query_start_loc_ptr, state_indices_ptr, b, stride_state_indices, T)
    rec = record_row(record_indices_ptr, b, HAS_RECORD_INDICES)
    if FLUSH:
        owned = (slot > NULL_SLOT) & (rec >= 0)
        pending_count = tl.load(pending_ptr + rec, mask=owned, other=0)
        pending = planned_flush_count(pending_count, T)
        writes_records = owned
    else:
        writes_records = (pid_v == 0) & (rec >= 0)
    if CONSUME_PENDING:
        consumed = (pid_v == 0) & (h == 0) & (slot > NULL_SLOT) & (rec >= 0)
        pending_count = tl.load(pending_ptr + rec, mask=consumed, other=0)
    offs_v = pid_v * BV + tl.arange(0, BV)
    offs_k = tl.arange(0, BK)
    mask_v = offs_v < V
    mask_k = offs_k < K
    if slot > NULL_SLOT:
        tile = state_ptr + ((slot * H + h) * V + offs_v[:, None]) * K + offs_k[None, :]
        S = tl.load(tile, mask=mask_v[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
        A_h = head_decay_rate(A_log_ptr, h)
        dt_bias = tl.load(dt_bias_ptr + h * K + offs_k, mask=mask_k, other=0.0)
        offs_t = tl.arange(0, BT)
        window = start + offs_t[:, None]
        in_window = (offs_t < length)[:, None] & mask_k[None, :]
        # the window's raw keys and gates: its key records, and read at once, its inputs
        recorded = (offs_t < tl.where(writes_records | WINDOW_AT_ONCE, length, 0))[:, None] & mask_k[None, :]
        k_window = tl.load(k_ptr + window * stride_k_tok + h * K + offs_k[None, :], mask=recorded, other=0.0)
        g_window = tl.load(g_ptr + window * stride_g_tok + h * K + offs_k[None, :], mask=recorded, other=0.0)
        if WINDOW_AT_ONCE:
            q_window = tl.load(q_ptr + window * stride_q_tok + h * K + offs_k[None, :], mask=in_window, other=0.0)
            values_window = tl.load(v_ptr + (start + offs_t[None, :]) * stride_v_tok + h * V + offs_v[:, None],
                                    mask=mask_v[:, None] & (offs_t < length)[None, :], other=0.0).to(tl.float32)
            betas = write_strength(tl.load(beta_ptr + (start + offs_t) * stride_beta_tok + h, mask=offs_t < length,
                                           other=0.0))
            keys, decays = token_key_and_decay(k_window, g_window, dt_bias[None, :], A_h, lower_bound,
                                               HAS_LOWER_BOUND)
            queries = token_queries(q_window, K)
            keys_dot_queries = tl.sum(keys * queries, axis=1)
        if FLUSH:
            # every pending record of an owned row is read up front, not after the count arrives
            for t in tl.static_range(T):
                S = fold_recorded_token(S, key_gate_ptr, correction_ptr, (rec * H + h) * T, t, t < pending, owned,
                                        offs_k, offs_v, dt_bias, A_h, lower_bound, K, V, HAS_LOWER_BOUND)
            S = S.to(state_ptr.dtype.element_ty).to(tl.float32)  # the window runs from the state as stored
            flushed = S
            # Every read of the pending records and count is done: arrive now, read the answers
            # after the window, so that the atomics' round trips overlap it.
            gpu_fence(FENCED)
            pair_count = arrive(counters_ptr + b * H + h, owned)
            row_count = arrive(counters_ptr + tl.num_programs(2) * H + b, owned)
        cols = tl.arange(0, BM)[None, :]
        UO = tl.zeros((BV, BM), tl.float32)  # as _verify_state_kernel's: corrections, then outputs
        for t in tl.static_range(T):
            # [BK] vectors, broadcast against the tile only in its products
            if WINDOW_AT_ONCE:
                key = tile_row(keys, offs_t, t)
                decay = tile_row(decays, offs_t, t)
                query = tile_row(queries, offs_t, t)
                values = tile_column(values_window, offs_t, t)
                beta = vector_entry(betas, offs_t, t)
                key_dot_query = vector_entry(keys_dot_queries, offs_t, t)
            else:
                live = t < length
                live_k = offs_k < tl.where(live, K, 0)
                tok = start + t
                k_raw = tl.load(k_ptr + tok * stride_k_tok + h * K + offs_k, mask=live_k, other=0.0)
                g_raw = tl.load(g_ptr + tok * stride_g_tok + h * K + offs_k, mask=live_k, other=0.0)
                q_raw = tl.load(q_ptr + tok * stride_q_tok + h * K + offs_k, mask=live_k, other=0.0)
                values = tl.load(v_ptr + tok * stride_v_tok + h * V + offs_v, mask=offs_v < tl.where(live, V, 0),
                                 other=0.0).to(tl.float32)
                beta = write_strength(tl.load(beta_ptr + tok * stride_beta_tok + h, mask=live, other=0.0))
                key, decay = token_key_and_decay(k_raw, g_raw, dt_bias, A_h, lower_bound, HAS_LOWER_BOUND)
                query = token_queries(q_raw, K)
                key_dot_query = tl.sum(key * query)
            # Both reductions read the state before this token's update, so neither waits for
            # the other: S_t q^ = (S_{t-1} a_t) q^ + u_t (k^ . q^).
            correction = beta * (values - tl.sum(S * (decay * key)[None, :], axis=1))
            output = tl.sum(S * (decay * query)[None, :], axis=1) + correction * key_dot_query
            if t + 1 < T:  # the state after the window is never stored
                S = recurrence_step(S, decay[None, :], key[None, :], correction[:, None])
            UO = tl.where(cols == t, correction[:, None], tl.where(cols == BT + t, output[:, None], UO))
        if FLUSH:
            # the last V-tile of the (row, head) to arrive writes the key records, the last
            # program of the row clears the count
            writes_records = arrived_last(pair_count, tl.num_programs(0), counters_ptr + b * H + h, owned)
            clears_count = arrived_last(row_count, H * tl.num_programs(0), counters_ptr + tl.num_programs(2) * H + b,
                                        owned)
            gpu_fence(FENCED)
            tl.store(tile, flushed.to(state_ptr.dtype.element_ty),
                     mask=mask_v[:, None] & (offs_k < tl.where(pending > 0, K, 0))[None, :])
            tl.store(pending_ptr + rec, 0, mask=clears_count)
        store_outputs(UO, out_ptr, start, length, h, offs_v, mask_v[:, None], stride_out_tok, V, BM)
        store_corrections(UO, correction_ptr, rec, h, length, offs_v, mask_v[:, None], H, V, T, BM)
        if writes_records:
            kg_rows = key_gate_ptr + ((rec * H + h) * T + offs_t[:, None]) * (2 * K)
            tl.store(kg_rows + offs_k[None, :], k_window, mask=recorded)
            tl.store(kg_rows + K + offs_k[None, :], g_window, mask=recorded)
    elif length > 0:
        store_outputs(tl.zeros((BV, BM), tl.float32), out_ptr, start, length, h, offs_v, mask_v[:, None],
                       stride_out_tok, V, BM)
    if FLUSH or CONSUME_PENDING:
        # last: warps issue in order, and a store waiting for the count would hold up every load behind it
        if CONSUME_PENDING:
            tl.store(pending_ptr + rec, 0, mask=consumed)
        store_flush_plan(b, (pid_v == 0) & (h == 0), slot, pending_count, commit_lens_ptr, final_state_indices_ptr,
                         boundary_state_indices_ptr, boundary_recovery_lens_ptr, NULL_SLOT, T)


def launch_token_loop(call: VerifyCall, cfg: VerifyConfig, pending=None, plan_rows=(None,) * 4,
                      consume: bool = False) -> None:
    """One launch of ``_verify_token_loop_kernel`` on ``cfg``'s tiles: stock, flushing (with
    ``pending`` counts and the ``plan_rows`` that receive them) or, with ``consume``, stock
    on a state already folded, consuming the counts and writing the plan."""
    device = call.v.device
    flush = pending is not None and not consume
    counters = row_counters(device, call.B * call.H + call.B) if flush else None
    _verify_token_loop_kernel[(triton.cdiv(call.V, cfg.block_v), call.H, call.B)](
        *call.one_kernel_args(), pending, plan_rows, counters, V=call.V, BK=cfg.block_k, BV=cfg.block_v,
        BT=cfg.block_t, FLUSH=flush, CONSUME_PENDING=consume, WINDOW_AT_ONCE=cfg.window_at_once,
        FENCED=Target.of(device).compiled, **call.shape_options(), **dependent_launch(device), num_warps=1,
        num_stages=1, maxnreg=cfg.max_registers)
