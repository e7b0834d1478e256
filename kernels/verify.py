"""RecoverSSM verify: a speculative window run from a read-only checkpoint.

One program owns one (V-tile, row, head) and reads its state tile ``S_0`` once. The state
is never stepped: by docs section 3b each token needs only ``S_0`` times two K-vectors,

    w_t = P_t k^_t,  p_t = P_t q^_t            P_t = a_1 * ... * a_t  (cumulative decay)
    u_t = b_t (v_t - S_0 w_t - sum_{j<t} A[t, j] u_j)        correction, [BV]
    o_t = S_0 p_t + sum_{j<=t} C[t, j] u_j                   output, [BV]

and the T x T couplings ``A[t, j] = Z_{t-1}[j] . (a_t k^_t)``, ``C[t, j] = Z_t[j] . q^_t``
come from the key history ``Z_t = Z_{t-1} a_t + e_t k^_t`` (``[T, K]``, the shared
recurrence step), in which every factor is a decay <= 1. The products with ``S_0`` are
independent of each other, so the only sequential chain is the T x T solve on
``[BV, T]`` columns. All arithmetic is float32 FMA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.buffers import NULL_BLOCK_ID, KDARecoverSSMRecords
from kernels.contract import check_verify_args
from kernels.launch import verify_config
from kernels.triton_math import l2_normalize_rows, recurrence_step, window_keys_and_gates


@triton.jit
def _verify_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, lower_bound,
    state_ptr, correction_ptr, key_gate_ptr, out_ptr,
    query_start_loc_ptr, state_indices_ptr, record_indices_ptr,
    stride_q_tok, stride_k_tok, stride_v_tok, stride_g_tok, stride_beta_tok, stride_out_tok,
    stride_state_indices, null_block_id,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    HAS_LOWER_BOUND: tl.constexpr, HAS_RECORD_INDICES: tl.constexpr,
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

    offs_v = pid_v * BV + tl.arange(0, BV)
    offs_k = tl.arange(0, BK)
    offs_t = tl.arange(0, BT)
    mask_v = offs_v < V
    mask_k = offs_k < K
    mask_vt = mask_v[:, None] & (offs_t[None, :] < length)
    out_ptrs = out_ptr + (start + offs_t[None, :]) * stride_out_tok + h * V + offs_v[:, None]

    if length > 0:
        if slot > null_block_id:
            S = tl.load(state_ptr + ((slot * H + h) * V + offs_v[:, None]) * K + offs_k[None, :],
                        mask=mask_v[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
            A_h = tl.exp(tl.load(A_log_ptr + h))
            dt_bias = tl.load(dt_bias_ptr + h * K + offs_k[None, :], mask=mask_k[None, :], other=0.0)
            cols = offs_t[None, :]
            cumulative = tl.full((1, BK), 1.0, tl.float32)
            Z = tl.zeros((BT, BK), tl.float32)
            U = tl.zeros((BV, BT), tl.float32)
            O = tl.zeros((BV, BT), tl.float32)
            for t in tl.static_range(T):
                live = t < length
                tok = start + tl.minimum(t, length - 1)
                k_raw = tl.load(k_ptr + tok * stride_k_tok + h * K + offs_k[None, :], mask=mask_k[None, :], other=0.0)
                g_raw = tl.load(g_ptr + tok * stride_g_tok + h * K + offs_k[None, :], mask=mask_k[None, :], other=0.0)
                q_raw = tl.load(q_ptr + tok * stride_q_tok + h * K + offs_k[None, :], mask=mask_k[None, :], other=0.0)
                v_t = tl.where(live, tl.load(v_ptr + tok * stride_v_tok + h * V + offs_v, mask=mask_v,
                                             other=0.0).to(tl.float32), 0.0)
                b_t = tl.sigmoid(tl.load(beta_ptr + tok * stride_beta_tok + h).to(tl.float32))
                if (pid_v == 0) & live & (rec >= 0):
                    kg_ptrs = key_gate_ptr + ((rec * H + h) * T + t) * (2 * K) + offs_k[None, :]
                    tl.store(kg_ptrs, k_raw, mask=mask_k[None, :])
                    tl.store(kg_ptrs + K, g_raw, mask=mask_k[None, :])

                key, g = window_keys_and_gates(k_raw, g_raw, live, dt_bias, A_h, lower_bound, HAS_LOWER_BOUND)
                query = tl.where(live, l2_normalize_rows(q_raw.to(tl.float32)), 0.0) * (K ** -0.5)
                decay = tl.exp(g)
                cumulative = cumulative * decay
                couple_u = tl.sum(Z * (decay * key), axis=1)
                Z = recurrence_step(Z, decay, key, (offs_t == t).to(tl.float32)[:, None])
                couple_o = tl.sum(Z * query, axis=1)

                u = b_t * (v_t - tl.sum(S * (cumulative * key), axis=1) - tl.sum(U * couple_u[None, :], axis=1))
                U = tl.where(cols == t, u[:, None], U)
                o = tl.sum(S * (cumulative * query), axis=1) + tl.sum(U * couple_o[None, :], axis=1)
                O = tl.where(cols == t, o[:, None], O)

            tl.store(out_ptrs, O.to(out_ptr.dtype.element_ty), mask=mask_vt)
            if rec >= 0:
                corr_ptrs = correction_ptr + ((rec * H + h) * T + offs_t[None, :]) * V + offs_v[:, None]
                tl.store(corr_ptrs, U, mask=mask_vt)
        else:
            tl.store(out_ptrs, tl.zeros((BV, BT), tl.float32).to(out_ptr.dtype.element_ty), mask=mask_vt)


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
    grid = (triton.cdiv(d.head_v_dim, cfg.block_v), d.batch, d.num_heads)
    _verify_kernel[grid](
        q, k, v, raw_g, raw_beta, A_log, dt_bias, 0.0 if lower_bound is None else float(lower_bound),
        checkpoint_state, records.correction, records.key_gate, out,
        query_start_loc, state_indices, record_indices,
        q.stride(1), k.stride(1), v.stride(1), raw_g.stride(1), raw_beta.stride(1), out.stride(1),
        state_indices.stride(0), NULL_BLOCK_ID,
        H=d.num_heads, K=d.head_k_dim, V=d.head_v_dim, T=d.spec_query_len,
        BK=cfg.block_k, BV=cfg.block_v, BT=cfg.block_t,
        HAS_LOWER_BOUND=lower_bound is not None, HAS_RECORD_INDICES=record_indices is not None,
        num_warps=cfg.num_warps, num_stages=1,
    )
    return out
