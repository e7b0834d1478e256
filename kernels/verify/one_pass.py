"""Verify, the one-pass design: one kernel, each V-tile building the window's operands itself.

For few (row, head) pairs (docs/design.md §9): one program per (V-tile, row, head)
builds each block of ``[W; P]``, ``A`` and ``C`` (``kernels.verify.window``) and takes its
product with the state block in the same pass, then ``mix`` and the outputs. Every V-tile
repeats the key side's work, which costs less there than a second kernel's wait.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.dependent_launch import dependent_launch, start_tile_head_row
from kernels.launch import DOT_PRECISION, VerifyConfig, factored_window
from kernels.triton_math import NULL_SLOT, head_decay_rate, record_row
from kernels.verify.window import (
    VerifyCall, load_window_block, store_outputs, store_window_results, window_beta, window_block, window_mix,
    window_row, window_values,
)


@triton.jit
def _verify_one_pass_kernel(
    tokens, token_strides, gate, state_ptr, records, rows, stride_state_indices,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr, BK: tl.constexpr, BKK: tl.constexpr,
    BV: tl.constexpr, BT: tl.constexpr, STAGES: tl.constexpr, HAS_LOWER_BOUND: tl.constexpr,
    HAS_RECORD_INDICES: tl.constexpr, FACTORED: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    """Per (V-tile, head, row): the key side's and the state kernel's work in one pass over
    the key channels, for few (row, head) pairs. Each block of ``BKK`` channels builds its
    share of ``[W; P]``, ``A`` and ``C`` (``window_block``) and its product with the state
    block at once, so the operand and ``mix`` stay in the program and no program waits for
    another. Every V-tile of a (row, head) builds them; the first writes the key records.
    Outputs and corrections as ``_verify_state_kernel``'s."""
    q_ptr, k_ptr, g_ptr, v_ptr, beta_ptr, out_ptr = tokens
    stride_q_tok, stride_k_tok, stride_g_tok, stride_v_tok, stride_beta_tok, stride_out_tok = token_strides
    A_log_ptr, dt_bias_ptr, lower_bound = gate
    key_gate_ptr, correction_ptr = records
    query_start_loc_ptr, state_indices_ptr, record_indices_ptr = rows
    pid_v, h, b = start_tile_head_row(DEPENDENT)
    BM: tl.constexpr = 2 * BT

    start, length, slot = window_row(query_start_loc_ptr, state_indices_ptr, b, stride_state_indices, T)
    offs_v = pid_v * BV + tl.arange(0, BV)
    mask_v = offs_v[:, None] < V
    if slot > NULL_SLOT:
        if length > 0:
            rec = record_row(record_indices_ptr, b, HAS_RECORD_INDICES)
            offs_t = tl.arange(0, BT)
            live = offs_t < length
            recorded = offs_t < tl.where((pid_v == 0) & (rec >= 0), length, 0)  # token rows this program records
            tok = start + offs_t[:, None]
            k_rows = k_ptr + tok * stride_k_tok + h * K
            q_rows = q_ptr + tok * stride_q_tok + h * K
            g_rows = g_ptr + tok * stride_g_tok + h * K
            kg_rows = key_gate_ptr + ((rec * H + h) * T + offs_t[:, None]) * (2 * K)
            state_rows = state_ptr + ((slot * H + h) * V + offs_v[:, None]) * K
            offs_m = tl.arange(0, BM)
            beta = window_beta(beta_ptr, start, h, offs_m, offs_m < length, stride_beta_tok)
            values = window_values(v_ptr, start, length, h, offs_v, mask_v, stride_v_tok, V, BM)
            A_h = head_decay_rate(A_log_ptr, h)
            sum_sq = tl.zeros((BM,), tl.float32)
            AC = tl.zeros((BM, BM), tl.float32)
            Y = tl.zeros((BV, BM), tl.float32)
            for k0 in tl.range(0, BK, BKK, num_stages=STAGES):
                offs_k = k0 + tl.arange(0, BKK)
                mask_k = offs_k < K
                S = tl.load(state_rows + offs_k[None, :], mask=mask_v & mask_k[None, :], other=0.0)
                k_raw, g_raw, q_raw, dt_bias = load_window_block(k_rows, g_rows, q_rows, dt_bias_ptr + h * K,
                                                                  offs_k, live, K)
                mask_rec = recorded[:, None] & mask_k[None, :]
                tl.store(kg_rows + offs_k[None, :], k_raw, mask=mask_rec)
                tl.store(kg_rows + K + offs_k[None, :], g_raw, mask=mask_rec)
                WP, sum_sq, AC = window_block(k_raw, g_raw, q_raw, dt_bias, live, A_h, lower_bound, sum_sq, AC,
                                               T, BT, BKK, HAS_LOWER_BOUND, FACTORED, DOT_PRECISION)
                Y = tl.dot(S.to(tl.float32), tl.trans(WP), Y, input_precision=DOT_PRECISION)
            row_scale, mix = window_mix(AC, sum_sq, beta, K, T, BT, DOT_PRECISION)
            store_window_results(Y, row_scale, mix, values, out_ptr, correction_ptr, start, length, rec, h,
                                  offs_v, mask_v, stride_out_tok, H, V, T, BM, DOT_PRECISION)
    elif length > 0:
        store_outputs(tl.zeros((BV, BM), tl.float32), out_ptr, start, length, h, offs_v, mask_v, stride_out_tok,
                       V, BM)


def launch_one_pass(call: VerifyCall, cfg: VerifyConfig) -> None:
    """One launch of ``_verify_one_pass_kernel`` on ``cfg``'s tiles."""
    _verify_one_pass_kernel[(triton.cdiv(call.V, cfg.block_v), call.H, call.B)](
        *call.one_kernel_args(), V=call.V, BK=cfg.block_k, BKK=cfg.block_kk, BV=cfg.block_v, BT=cfg.block_t,
        STAGES=cfg.stages, FACTORED=factored_window(call.lower_bound, call.T), DOT_PRECISION=DOT_PRECISION,
        **call.shape_options(), **dependent_launch(call.v.device), num_warps=cfg.num_warps, num_stages=1)
