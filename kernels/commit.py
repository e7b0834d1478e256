"""RecoverSSM commit: fold recorded tokens into checkpoint slots (docs: sections 3 and 6).

One program owns one (V-tile, row, head). It reads the row's source slot once, applies
the first ``n = commit_lens[b]`` records forwards with the shared recurrence step,

    S <- S * a_t + u_t (x) k^_t          a_t, k^_t rebuilt from the raw key and gate records

writes the boundary slot after ``boundary_recovery_lens[b]`` of them and the final slot at
the end. Records past ``n`` are masked out before they touch the state, so NaN there is inert.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.buffers import NULL_BLOCK_ID, CommitPlan, KDARecoverSSMRecords
from kernels.contract import check_commit_args
from kernels.launch import commit_config
from kernels.triton_math import recurrence_step, window_keys_and_gates


@triton.jit
def _commit_kernel(
    state_ptr, correction_ptr, key_gate_ptr, A_log_ptr, dt_bias_ptr, lower_bound,
    state_indices_ptr, record_indices_ptr,
    commit_lens_ptr, final_state_indices_ptr, boundary_state_indices_ptr, boundary_recovery_lens_ptr,
    stride_state_indices, null_block_id,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    HAS_LOWER_BOUND: tl.constexpr, HAS_RECORD_INDICES: tl.constexpr,
):
    pid_v = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)

    n = tl.load(commit_lens_ptr + b)
    source = tl.load(state_indices_ptr + b * stride_state_indices).to(tl.int64)
    final = tl.load(final_state_indices_ptr + b).to(tl.int64)
    boundary = tl.load(boundary_state_indices_ptr + b).to(tl.int64)
    recovery = tl.load(boundary_recovery_lens_ptr + b)
    if HAS_RECORD_INDICES:
        rec = tl.load(record_indices_ptr + b).to(tl.int64)
    else:
        rec = b.to(tl.int64)

    if (n > 0) & (source > null_block_id) & (rec >= 0):
        offs_v = pid_v * BV + tl.arange(0, BV)
        offs_k = tl.arange(0, BK)
        mask_v = offs_v < V
        mask_k = offs_k < K
        mask_vk = mask_v[:, None] & mask_k[None, :]
        tile = (h * V + offs_v[:, None]) * K + offs_k[None, :]
        S = tl.load(state_ptr + source * (H * V * K) + tile, mask=mask_vk, other=0.0).to(tl.float32)

        A_h = tl.exp(tl.load(A_log_ptr + h))
        dt_bias = tl.load(dt_bias_ptr + h * K + offs_k, mask=mask_k, other=0.0)
        for t in tl.static_range(T):
            live = t < n
            base = (rec * H + h) * T + t
            kg_ptrs = key_gate_ptr + base * (2 * K) + offs_k[None, :]
            k_raw = tl.load(kg_ptrs, mask=mask_k[None, :], other=0.0)
            g_raw = tl.load(kg_ptrs + K, mask=mask_k[None, :], other=0.0)
            u = tl.where(live, tl.load(correction_ptr + base * V + offs_v, mask=mask_v, other=0.0), 0.0)
            key, g = window_keys_and_gates(k_raw, g_raw, live, dt_bias, A_h, lower_bound, HAS_LOWER_BOUND)
            S = recurrence_step(S, tl.exp(g), key, u[:, None])
            if (boundary > null_block_id) & (recovery == t + 1) & live:
                tl.store(state_ptr + boundary * (H * V * K) + tile, S.to(state_ptr.dtype.element_ty), mask=mask_vk)
        if final > null_block_id:
            tl.store(state_ptr + final * (H * V * K) + tile, S.to(state_ptr.dtype.element_ty), mask=mask_vk)


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
        H=H, K=K, V=V, T=T, BK=cfg.block_k, BV=cfg.block_v,
        HAS_LOWER_BOUND=lower_bound is not None, HAS_RECORD_INDICES=record_indices is not None,
        num_warps=cfg.num_warps, num_stages=1,
    )
