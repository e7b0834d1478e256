"""RecoverSSM verify: a speculative window run from a read-only checkpoint.

One program owns one (V-tile, row, head). It never steps the state token by token; the
window is computed in the matrix form of docs section 3b from one read of the state.
With ``G`` the cumulative log decay over the window and ``k^``, ``q^`` the normalised keys
and queries (``[T, K]`` tiles):

    W = exp(G) * k^,  P = exp(G) * q^
    A = strict_lower(W (exp(-G) * k^)^T),  C = lower(P (exp(-G) * k^)^T)       T x T
    U = b * (V - S_0 W^T) (I + diag(b) A)^-T                                   [BV, T]
    O = S_0 P^T + U C^T                                                        [BV, T]

The factored products ``exp(G) exp(-G)`` stay finite while the whole window's log decay
is bounded (a lower bound on the gate, as Kimi-K3 uses); otherwise ``A`` and ``C`` are
built one token at a time with the shared recurrence step, where every factor is <= 1.
The state is touched by two small matrix products in float32 (split-precision tf32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.buffers import NULL_BLOCK_ID, KDARecoverSSMRecords
from kernels.contract import check_verify_args
from kernels.launch import DOT_PRECISION, factored_window, verify_config
from kernels.triton_math import l2_normalize_rows, recurrence_step, tile_row, window_keys_and_gates


@triton.jit
def _stepwise_window_products(g, key, query, T: tl.constexpr, BT: tl.constexpr):
    """``A`` and ``C`` of a window by the recurrence ``Z_t = Z_{t-1} a_t + e_t k^_t``."""
    offs_t = tl.arange(0, BT)
    rows = offs_t[:, None]
    Z = tl.zeros(key.shape, tl.float32)
    A = tl.zeros((BT, BT), tl.float32)
    C = tl.zeros((BT, BT), tl.float32)
    for t in tl.static_range(T):
        a_t = tl.exp(tile_row(g, offs_t, t))
        key_t = tile_row(key, offs_t, t)
        A = tl.where(rows == t, tl.sum(Z * (a_t * key_t)[None, :], axis=1)[None, :], A)
        Z = recurrence_step(Z, a_t[None, :], key_t[None, :], (offs_t == t).to(tl.float32)[:, None])
        C = tl.where(rows == t, tl.sum(Z * tile_row(query, offs_t, t)[None, :], axis=1)[None, :], C)
    return A, C


@triton.jit
def _unit_lower_inverse(A, beta, T: tl.constexpr, BT: tl.constexpr):
    """``(I + diag(beta) A)^-1`` for strictly lower ``A [BT, BT]``, by forward substitution."""
    offs_t = tl.arange(0, BT)
    inverse = tl.zeros((BT, BT), tl.float32)
    for t in tl.static_range(T):
        b_t = tl.sum(tl.where(offs_t == t, beta, 0.0), axis=0)
        a_row = tile_row(A, offs_t, t)
        row = (offs_t == t).to(tl.float32) - b_t * tl.sum(a_row[:, None] * inverse, axis=0)
        inverse = tl.where(offs_t[:, None] == t, row[None, :], inverse)
    return inverse


@triton.jit
def _verify_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, lower_bound,
    state_ptr, correction_ptr, key_gate_ptr, out_ptr,
    query_start_loc_ptr, state_indices_ptr, record_indices_ptr,
    stride_q_tok, stride_k_tok, stride_v_tok, stride_g_tok, stride_beta_tok, stride_out_tok,
    stride_state_indices, null_block_id,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, CHUNKS: tl.constexpr,
    HAS_LOWER_BOUND: tl.constexpr, HAS_RECORD_INDICES: tl.constexpr, FACTORED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_v = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)

    start = tl.load(query_start_loc_ptr + b)
    length = tl.minimum(tl.load(query_start_loc_ptr + b + 1) - start, T)
    slot = tl.load(state_indices_ptr + b * stride_state_indices).to(tl.int64)
    if HAS_RECORD_INDICES:
        rec = tl.load(record_indices_ptr + b).to(tl.int64)
    else:
        rec = b.to(tl.int64)

    offs_k = tl.arange(0, BK)
    offs_t = tl.arange(0, BT)
    mask_k = offs_k < K
    live = offs_t < length

    if length > 0:
        if slot > null_block_id:
            mask_tk = live[:, None] & mask_k[None, :]
            tok = start + offs_t[:, None]
            k_raw = tl.load(k_ptr + tok * stride_k_tok + h * K + offs_k[None, :], mask=mask_tk, other=0.0)
            g_raw = tl.load(g_ptr + tok * stride_g_tok + h * K + offs_k[None, :], mask=mask_tk, other=0.0)
            q_raw = tl.load(q_ptr + tok * stride_q_tok + h * K + offs_k[None, :], mask=mask_tk, other=0.0)
            beta = tl.sigmoid(tl.load(beta_ptr + (start + offs_t) * stride_beta_tok + h, mask=live,
                                      other=0.0).to(tl.float32))
            A_h = tl.exp(tl.load(A_log_ptr + h))
            dt_bias = tl.load(dt_bias_ptr + h * K + offs_k, mask=mask_k, other=0.0)

            key, g = window_keys_and_gates(k_raw, g_raw, live[:, None], dt_bias, A_h, lower_bound, HAS_LOWER_BOUND)
            query = tl.where(live[:, None], l2_normalize_rows(q_raw.to(tl.float32)), 0.0) * (K ** -0.5)
            G = tl.cumsum(g, axis=0)
            W = tl.exp(G) * key
            P = tl.exp(G) * query
            if FACTORED:
                rows = offs_t[:, None]
                cols = offs_t[None, :]
                growth = tl.exp(-G) * key
                A = tl.where(cols < rows, tl.dot(W, tl.trans(growth), input_precision=DOT_PRECISION), 0.0)
                C = tl.where(cols <= rows, tl.dot(P, tl.trans(growth), input_precision=DOT_PRECISION), 0.0)
            else:
                A, C = _stepwise_window_products(g, key, query, T, BT)
            inverse = _unit_lower_inverse(A, beta, T, BT)

            if (pid_v == 0) & (rec >= 0):
                kg_ptrs = key_gate_ptr + ((rec * H + h) * T + offs_t[:, None]) * (2 * K) + offs_k[None, :]
                tl.store(kg_ptrs, k_raw, mask=mask_tk)
                tl.store(kg_ptrs + K, g_raw, mask=mask_tk)

            for c in tl.static_range(CHUNKS):
                offs_v = (pid_v * CHUNKS + c) * BV + tl.arange(0, BV)
                mask_v = offs_v < V
                mask_vt = mask_v[:, None] & live[None, :]
                S = tl.load(state_ptr + ((slot * H + h) * V + offs_v[:, None]) * K + offs_k[None, :],
                            mask=mask_v[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
                values = tl.load(v_ptr + (start + offs_t[None, :]) * stride_v_tok + h * V + offs_v[:, None],
                                 mask=mask_vt, other=0.0).to(tl.float32)
                SW = tl.dot(S, tl.trans(W), input_precision=DOT_PRECISION)
                SP = tl.dot(S, tl.trans(P), input_precision=DOT_PRECISION)
                U = tl.dot(beta[None, :] * (values - SW), tl.trans(inverse), input_precision=DOT_PRECISION)
                O = SP + tl.dot(U, tl.trans(C), input_precision=DOT_PRECISION)
                tl.store(out_ptr + (start + offs_t[None, :]) * stride_out_tok + h * V + offs_v[:, None],
                         O.to(out_ptr.dtype.element_ty), mask=mask_vt)
                if rec >= 0:
                    corr_ptrs = correction_ptr + ((rec * H + h) * T + offs_t[None, :]) * V + offs_v[:, None]
                    tl.store(corr_ptrs, U, mask=mask_vt)
        else:
            for c in tl.static_range(CHUNKS):
                offs_v = (pid_v * CHUNKS + c) * BV + tl.arange(0, BV)
                tl.store(out_ptr + (start + offs_t[None, :]) * stride_out_tok + h * V + offs_v[:, None],
                         tl.zeros((BV, BT), tl.float32).to(out_ptr.dtype.element_ty),
                         mask=(offs_v < V)[:, None] & live[None, :])


def kda_recoverssm_verify(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, checkpoint_state,
                          records: KDARecoverSSMRecords, query_start_loc, state_indices, spec_query_len,
                          out=None, record_indices=None):
    """Verify a speculative batch (docs: sections 4 and 5); returns ``out`` ``[1, T_tot, H, V]``.

    Writes the in-window outputs of every row (zeros for null rows) and, for rows with a
    real slot, the records of each in-window token at record row ``record_indices[b]``
    (or ``b``). The checkpoint is only read. ``out=None`` allocates a zeroed output.
    """
    d = check_verify_args(q, k, v, raw_g, raw_beta, A_log, dt_bias, checkpoint_state, records,
                          query_start_loc, state_indices, spec_query_len, out, record_indices)
    if out is None:
        out = torch.zeros_like(v)
    if d.total_tokens == 0 or d.batch == 0:
        return out
    cfg = verify_config(d.batch, d.num_heads, d.head_k_dim, d.head_v_dim, d.spec_query_len)
    grid = (triton.cdiv(d.head_v_dim, cfg.block_v * cfg.chunks_v), d.batch, d.num_heads)
    _verify_kernel[grid](
        q, k, v, raw_g, raw_beta, A_log, dt_bias, 0.0 if lower_bound is None else float(lower_bound),
        checkpoint_state, records.correction, records.key_gate, out,
        query_start_loc, state_indices, record_indices,
        q.stride(1), k.stride(1), v.stride(1), raw_g.stride(1), raw_beta.stride(1), out.stride(1),
        state_indices.stride(0), NULL_BLOCK_ID,
        H=d.num_heads, K=d.head_k_dim, V=d.head_v_dim, T=d.spec_query_len,
        BK=cfg.block_k, BV=cfg.block_v, BT=cfg.block_t, CHUNKS=cfg.chunks_v,
        HAS_LOWER_BOUND=lower_bound is not None, HAS_RECORD_INDICES=record_indices is not None,
        FACTORED=factored_window(lower_bound, d.spec_query_len),
        DOT_PRECISION=DOT_PRECISION, num_warps=cfg.num_warps, num_stages=1,
    )
    return out
