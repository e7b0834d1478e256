"""Torch reference of every RecoverSSM op: the oracle for tests and the source of traces.

It applies the recurrence token by token (docs/design.md §2), vectorised over rows and heads,
on any device. Arithmetic runs in float64 when the checkpoint pool is float64 and in
float32 otherwise; results are stored in each buffer's own dtype. Signatures, argument
checks and the null, padding and plan rules are those of the Triton implementation.
"""

from __future__ import annotations

import torch

from kernels.buffers import NULL_BLOCK_ID, CommitPlan, KDARecoverSSMRecords, allocate_records  # noqa: F401 (API)
from kernels.contract import (
    check_commit_args, check_flush_args, check_pending_args, check_plan_args, check_verify_args,
)

SOFTPLUS_THRESHOLD = 20.0
NORM_EPS = 1e-6


def compute_dtype(checkpoint_state: torch.Tensor) -> torch.dtype:
    return torch.float64 if checkpoint_state.dtype == torch.float64 else torch.float32


def log_decay(raw_g: torch.Tensor, dt_bias: torch.Tensor, A_log: torch.Tensor,
              lower_bound: float | None) -> torch.Tensor:
    """Per-channel log decay ``g`` of ``raw_g [..., H, K]``; ``dt_bias`` is ``[H, K]``."""
    A = torch.exp(A_log)[:, None].to(raw_g.dtype)
    x = raw_g + dt_bias.to(raw_g.dtype)
    if lower_bound is not None:
        return lower_bound * torch.sigmoid(A * x)
    softplus = torch.where(x > SOFTPLUS_THRESHOLD, x, torch.log1p(torch.exp(x)))
    return -A * softplus


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + NORM_EPS)


def recurrence_step(S: torch.Tensor, decay: torch.Tensor, key: torch.Tensor, correction: torch.Tensor) -> torch.Tensor:
    """``S [..., V, K] * decay[..., None, :] + correction[..., :, None] * key[..., None, :]``."""
    return S * decay[..., None, :] + correction[..., :, None] * key[..., None, :]


def kda_recoverssm_verify(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, checkpoint_state,
                          records: KDARecoverSSMRecords, query_start_loc, state_indices, spec_query_len,
                          out=None, record_indices=None):
    """Run each row's window from its checkpoint; write outputs and records, never the checkpoint."""
    d = check_verify_args(q, k, v, raw_g, raw_beta, A_log, dt_bias, checkpoint_state, records,
                          query_start_loc, state_indices, spec_query_len, out, record_indices)
    if out is None:
        out = torch.zeros_like(v)
    if d.total_tokens == 0 or d.batch == 0:
        return out
    cdt = compute_dtype(checkpoint_state)
    H, K, T = d.num_heads, d.head_k_dim, d.spec_query_len
    dev = v.device
    qsl = query_start_loc.long()
    starts = qsl[:-1]
    lens = (qsl[1:] - starts).clamp(0, T)
    slots = state_indices.long()
    rec_rows = record_indices.long() if record_indices is not None else torch.arange(d.batch, device=dev)
    real = slots > NULL_BLOCK_ID
    writes_records = real & (rec_rows >= 0)
    dt = dt_bias.view(H, K)

    S = checkpoint_state[slots.clamp(min=0)].to(cdt)
    for t in range(T):
        in_window = t < lens
        if not bool(in_window.any()):
            break
        tok = (starts + t).clamp(0, d.total_tokens - 1)
        k_raw, g_raw = k[0, tok], raw_g[0, tok]
        decay = torch.exp(log_decay(g_raw.to(cdt), dt, A_log, lower_bound))
        key = l2_normalize(k_raw.to(cdt))
        query = l2_normalize(q[0, tok].to(cdt)) * K ** -0.5
        beta = torch.sigmoid(raw_beta[0, tok].to(cdt))
        decayed = S * decay[..., None, :]
        u = beta[..., None] * (v[0, tok].to(cdt) - (decayed @ key[..., None]).squeeze(-1))
        S_next = recurrence_step(S, decay, key, u)
        o = (S_next @ query[..., None]).squeeze(-1)
        active = in_window & real
        S = torch.where(active[:, None, None, None], S_next, S)

        out[0, tok[active]] = o[active].to(out.dtype)
        out[0, tok[in_window & ~real]] = 0
        rec = in_window & writes_records
        records.correction[rec_rows[rec], :, t] = u[rec].to(records.correction.dtype)
        records.key_gate[rec_rows[rec], :, t] = torch.cat([k_raw[rec], g_raw[rec]], dim=-1)
    return out


def kda_recoverssm_plan(plan: CommitPlan, num_accepted, query_start_loc, state_indices, spec_query_len,
                        block_table=None, num_computed=None, block_size=None) -> CommitPlan:
    """Fill ``plan`` for a stock commit (docs/design.md §6); align mode when a block table is given."""
    B = check_plan_args(plan, num_accepted, query_start_loc, state_indices, spec_query_len,
                        block_table, num_computed, block_size)
    rows = plan.rows(B)
    qsl = query_start_loc.long()
    n = torch.minimum(num_accepted.long().clamp(min=0), (qsl[1:] - qsl[:-1]).clamp(min=0)).clamp(max=spec_query_len)
    slots = state_indices.long()
    valid = (slots > NULL_BLOCK_ID) & (n > 0)
    null = torch.full_like(slots, NULL_BLOCK_ID)
    rows.commit_lens.copy_(torch.where(valid, n, 0))
    if block_table is None:
        rows.final_state_indices.copy_(torch.where(valid, slots, null))
        rows.boundary_state_indices.fill_(NULL_BLOCK_ID)
        rows.boundary_recovery_lens.zero_()
        return rows
    width = block_table.shape[1]
    table = block_table.long()
    computed = num_computed.long()
    c_end = computed + n
    final_col = ((c_end - 1).clamp(min=0) // block_size).clamp(max=width - 1)
    final = table.gather(1, final_col[:, None]).squeeze(1)
    next_boundary = (computed // block_size + 1) * block_size
    boundary_col = next_boundary // block_size - 1
    has_boundary = valid & (c_end >= next_boundary) & (boundary_col < width)
    boundary = table.gather(1, boundary_col.clamp(max=width - 1)[:, None]).squeeze(1)
    rows.final_state_indices.copy_(torch.where(valid, final, null))
    rows.boundary_state_indices.copy_(torch.where(has_boundary, boundary, null))
    rows.boundary_recovery_lens.copy_(torch.where(has_boundary, next_boundary - computed, 0))
    return rows


def kda_recoverssm_defer(plan: CommitPlan, state_indices, record_rows, pending, eager=None) -> None:
    """Move the plan's commit lengths into ``pending`` for rows that are not eager (docs/design.md §7)."""
    B = check_pending_args(state_indices, record_rows, pending, plan, eager)
    rows = plan.rows(B)
    for b in range(B):
        slot, row = int(state_indices[b]), int(record_rows[b])
        if slot <= NULL_BLOCK_ID or row < 0:
            continue
        if eager is not None and bool(eager[b]):
            pending[row] = 0
        else:
            pending[row] = rows.commit_lens[b]
            rows.commit_lens[b] = 0


def kda_recoverssm_plan_deferred(plan: CommitPlan, num_accepted, query_start_loc, state_indices, spec_query_len,
                                 record_rows, pending, eager=None, block_table=None, num_computed=None,
                                 block_size=None) -> CommitPlan:
    """``kda_recoverssm_plan``, then ``kda_recoverssm_defer`` (docs/design.md §7)."""
    check_pending_args(state_indices, record_rows, pending, plan, eager)  # before either writes
    rows = kda_recoverssm_plan(plan, num_accepted, query_start_loc, state_indices, spec_query_len, block_table,
                               num_computed, block_size)
    kda_recoverssm_defer(plan, state_indices, record_rows, pending, eager)
    return rows


def _prepare_flush_plan(plan: CommitPlan, state_indices, record_rows, pending, spec_query_len: int,
                        consume: bool) -> CommitPlan:
    """Fill ``plan`` to fold each row's pending records in place; ``consume`` zeroes the counts read."""
    B = check_pending_args(state_indices, record_rows, pending, plan)
    rows = plan.rows(B)
    for b in range(B):
        slot, row = int(state_indices[b]), int(record_rows[b])
        count = 0
        if slot > NULL_BLOCK_ID and row >= 0:
            count = min(max(int(pending[row]), 0), spec_query_len)
            if consume:
                pending[row] = 0
        rows.commit_lens[b] = count
        rows.final_state_indices[b] = slot
    rows.boundary_state_indices.fill_(NULL_BLOCK_ID)
    rows.boundary_recovery_lens.zero_()
    return rows


def kda_recoverssm_commit(checkpoint_state, records: KDARecoverSSMRecords, A_log, dt_bias, lower_bound,
                          state_indices, plan: CommitPlan, record_indices=None) -> None:
    """Fold each row's first ``commit_lens`` records into its final (and boundary) slot."""
    B, H, K, _ = check_commit_args(checkpoint_state, records, A_log, dt_bias, state_indices, plan, record_indices)
    if B == 0:
        return
    rows = plan.rows(B)
    dev = checkpoint_state.device
    cdt = compute_dtype(checkpoint_state)
    rec_rows = record_indices.long() if record_indices is not None else torch.arange(B, device=dev)
    slots = state_indices.long()
    n = rows.commit_lens.long()
    final = rows.final_state_indices.long()
    boundary = rows.boundary_state_indices.long()
    recovery = rows.boundary_recovery_lens.long()
    valid = (n > 0) & (slots > NULL_BLOCK_ID) & (rec_rows >= 0)
    if not bool(valid.any()):
        return
    slots, rec_rows, n, final, boundary, recovery = (x[valid] for x in (slots, rec_rows, n, final, boundary, recovery))
    dt = dt_bias.view(H, K)
    S = checkpoint_state[slots].to(cdt)
    key_gate = records.key_gate[rec_rows]
    correction = records.correction[rec_rows]
    writes_boundary = (boundary > NULL_BLOCK_ID) & (recovery >= 1) & (recovery <= n)
    for t in range(int(n.max())):
        decay = torch.exp(log_decay(key_gate[:, :, t, K:].to(cdt), dt, A_log, lower_bound))
        key = l2_normalize(key_gate[:, :, t, :K].to(cdt))
        S_next = recurrence_step(S, decay, key, correction[:, :, t].to(cdt))
        S = torch.where((t < n)[:, None, None, None], S_next, S)
        at_boundary = writes_boundary & (recovery == t + 1)
        if bool(at_boundary.any()):
            checkpoint_state[boundary[at_boundary]] = S[at_boundary].to(checkpoint_state.dtype)
    has_final = final > NULL_BLOCK_ID
    checkpoint_state[final[has_final]] = S[has_final].to(checkpoint_state.dtype)


def kda_recoverssm_flush(checkpoint_state, records: KDARecoverSSMRecords, A_log, dt_bias, lower_bound,
                         state_indices, record_rows, pending, plan: CommitPlan, consume_pending: bool = True) -> None:
    """Fold every pending replay into its slot in place and consume its count, or leave the
    counts as they are with ``consume_pending=False`` (docs/design.md §7)."""
    check_flush_args(checkpoint_state, records, A_log, dt_bias, state_indices, record_rows, pending, plan)
    _prepare_flush_plan(plan, state_indices, record_rows, pending, records.spec_query_len, consume_pending)
    kda_recoverssm_commit(checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, plan,
                          record_indices=record_rows)


def kda_recoverssm_flush_verify(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, checkpoint_state,
                                records: KDARecoverSSMRecords, query_start_loc, state_indices, spec_query_len,
                                record_rows, pending, plan: CommitPlan, out=None):
    """``kda_recoverssm_flush``, then ``kda_recoverssm_verify`` with ``record_indices=record_rows``."""
    check_pending_args(state_indices, record_rows, pending, plan, records=records)
    check_verify_args(q, k, v, raw_g, raw_beta, A_log, dt_bias, checkpoint_state, records, query_start_loc,
                      state_indices, spec_query_len, out, record_rows)
    kda_recoverssm_flush(checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, record_rows, pending,
                         plan)
    return kda_recoverssm_verify(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, checkpoint_state, records,
                                 query_start_loc, state_indices, spec_query_len, out=out, record_indices=record_rows)
