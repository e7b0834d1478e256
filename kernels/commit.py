"""RecoverSSM commit: fold recorded tokens into checkpoint slots (docs: sections 3 and 6).

One program owns one (V-tile, row, head). Folding the first ``n`` records is one product:
with ``g`` the log decays and ``k^`` the normalised keys rebuilt from the raw records, and
``U [V, T]`` the recorded corrections,

    S_n = S_0 * exp(sum_{t<n} g_t) + U F_n,   F_n[t] = exp(sum_{t<j<n} g_j) k^_t  (t < n, else 0)

Every exponent is a sum of log decays, so every factor is <= 1 whatever the gate. Each
column of ``F`` depends on its key channel alone (after the key norms), so the program walks
the state in blocks of key channels, building that block of ``F`` beside the state block.
The boundary slot, after ``boundary_recovery_lens[b]`` records, is the same fold with its
own ``F``. Records past ``n`` are masked out before they are read, so NaN there is inert.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.buffers import NULL_BLOCK_ID, CommitPlan, KDARecoverSSMRecords
from kernels.contract import check_commit_args
from kernels.launch import DOT_PRECISION, commit_config
from kernels.triton_math import fold_operand, inverse_norm, record_keys_and_gates, record_row, sum_of_squares


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
def _commit_kernel(
    state_ptr, correction_ptr, key_gate_ptr, A_log_ptr, dt_bias_ptr, lower_bound,
    state_indices_ptr, record_indices_ptr,
    commit_lens_ptr, final_state_indices_ptr, boundary_state_indices_ptr, boundary_recovery_lens_ptr,
    stride_state_indices, null_block_id,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr,
    BK: tl.constexpr, BKK: tl.constexpr, BOUNDARY_BKK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    STAGES: tl.constexpr, HAS_LOWER_BOUND: tl.constexpr, HAS_RECORD_INDICES: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Per (V-tile, row, head). Rows with a boundary slot take both folds from one read of
    each column block (the boundary slot may be the source), in narrower blocks of
    ``BOUNDARY_BKK`` so that this rarer path does not set the kernel's register count."""
    pid_v = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)

    n = tl.minimum(tl.load(commit_lens_ptr + b), T)
    source = tl.load(state_indices_ptr + b * stride_state_indices).to(tl.int64)
    final = tl.load(final_state_indices_ptr + b).to(tl.int64)
    boundary = tl.load(boundary_state_indices_ptr + b).to(tl.int64)
    recovery = tl.load(boundary_recovery_lens_ptr + b)
    rec = record_row(record_indices_ptr, b, HAS_RECORD_INDICES)

    if (n > 0) & (source > null_block_id) & (rec >= 0):
        offs_t = tl.arange(0, BT)
        offs_v = pid_v * BV + tl.arange(0, BV)
        mask_v = offs_v < V
        live = offs_t < n
        first = (rec * H + h) * T
        kg_rows = key_gate_ptr + (first + offs_t[:, None]) * (2 * K)
        key_sq = tl.zeros((BT,), tl.float32)
        for n0 in tl.static_range(0, BK, BKK):
            norm_cols = n0 + tl.arange(0, BKK)
            key_sq += sum_of_squares(tl.load(kg_rows + norm_cols[None, :],
                                             mask=live[:, None] & (norm_cols < K)[None, :], other=0.0))
        key_scale = inverse_norm(key_sq)[:, None]
        U = tl.load(correction_ptr + (first + offs_t[None, :]) * V + offs_v[:, None],
                    mask=mask_v[:, None] & live[None, :], other=0.0)
        A_h = tl.exp(tl.load(A_log_ptr + h))
        dt_bias_row = dt_bias_ptr + h * K
        rows = (h * V + offs_v[:, None]) * K
        source_rows = state_ptr + source * (H * V * K) + rows
        final_rows = state_ptr + final * (H * V * K) + rows
        boundary_rows = state_ptr + boundary * (H * V * K) + rows
        has_final = final > null_block_id
        dtype = state_ptr.dtype.element_ty
        if (boundary > null_block_id) & (recovery > 0) & (recovery <= n):
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
    cfg = commit_config(B, H, K, V, T)
    grid = (triton.cdiv(V, cfg.block_v), B, H)
    _commit_kernel[grid](
        checkpoint_state, records.correction, records.key_gate, A_log, dt_bias,
        0.0 if lower_bound is None else float(lower_bound),
        state_indices, record_indices,
        plan.commit_lens, plan.final_state_indices, plan.boundary_state_indices, plan.boundary_recovery_lens,
        state_indices.stride(0), NULL_BLOCK_ID,
        H=H, K=K, V=V, T=T, BK=cfg.block_k, BKK=cfg.block_kk, BOUNDARY_BKK=cfg.boundary_block_kk, BV=cfg.block_v,
        BT=cfg.block_t, STAGES=cfg.stages,
        HAS_LOWER_BOUND=lower_bound is not None, HAS_RECORD_INDICES=record_indices is not None,
        DOT_PRECISION=DOT_PRECISION, num_warps=cfg.num_warps, num_stages=1,
    )
