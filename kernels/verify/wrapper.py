"""RecoverSSM verify: a speculative window run from a read-only checkpoint, and its flushing form.

Three designs, one module each, chosen by ``kernels.launch`` (docs/design.md §9):

- ``kernels.verify.token_loop``: the window one token at a time on a state tile held in
  registers, for the fewest tokens;
- ``kernels.verify.one_pass``: the window's matrix form in one kernel, every V-tile building
  the window's operands, for few (row, head) pairs;
- ``kernels.verify.two_kernels``: the key side once per (row, head), then one pipelined read
  of each state tile, for the rest.

``kda_recoverssm_flush_verify`` runs the token loop or the two kernels folding each row's
pending records first, so that a deferred step reads each slot once; for the fewest pairs
(``flush-apart``) the fold runs alone (``kernels.commit.fold_pending``), then the stock
token loop, which consumes the counts and writes the flush plan.
Products with the state are float32 (split-precision tf32).
"""

from __future__ import annotations

import torch

from kernels.buffers import CommitPlan, KDARecoverSSMRecords
from kernels.commit.wrapper import fold_pending
from kernels.contract import check_pending_args, check_verify_args
from kernels.launch import Target, verify_config
from kernels.verify.one_pass import launch_one_pass
from kernels.verify.token_loop import launch_token_loop
from kernels.verify.two_kernels import launch_two_kernels
from kernels.verify.window import VerifyCall


def _launch(call: VerifyCall, pending=None, plan: CommitPlan | None = None) -> None:
    """Verify in the design ``verify_config`` picks; with ``pending`` counts (and the ``plan``
    that receives them) it first folds each row's pending records into its slot."""
    target = Target.of(call.v.device)
    flush = pending is not None
    cfg = verify_config(call.B, call.H, call.K, call.V, call.T, flush, target)
    plan_rows = (plan.commit_lens, plan.final_state_indices, plan.boundary_state_indices,
                 plan.boundary_recovery_lens) if flush else (None,) * 4
    if cfg.design == "flush-apart":  # the fold, then the stock token loop, which consumes the counts
        fold_pending(call.state, call.records, call.A_log, call.dt_bias, call.lower_bound, call.state_indices,
                     call.record_indices, pending)
        stock = verify_config(call.B, call.H, call.K, call.V, call.T, target=target, design="token-loop")
        launch_token_loop(call, stock, pending, plan_rows, consume=True)
    elif cfg.design.startswith("token-loop"):
        launch_token_loop(call, cfg, pending, plan_rows)
    elif cfg.design == "one-pass":
        launch_one_pass(call, cfg)
    else:
        launch_two_kernels(call, cfg, pending, plan_rows)


def _call(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, checkpoint_state, records, query_start_loc,
          state_indices, d, out, record_indices) -> VerifyCall:
    return VerifyCall(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, checkpoint_state, records,
                      query_start_loc, state_indices, record_indices, out, d.batch, d.num_heads, d.head_k_dim,
                      d.head_v_dim, d.spec_query_len)


def kda_recoverssm_verify(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, checkpoint_state,
                          records: KDARecoverSSMRecords, query_start_loc, state_indices, spec_query_len,
                          out=None, record_indices=None):
    """Verify a speculative batch (docs/design.md §4, §5); returns ``out`` ``[1, T_tot, H, V]``.

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
    _launch(_call(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, checkpoint_state, records, query_start_loc,
                  state_indices, d, out, record_indices))
    return out


def kda_recoverssm_flush_verify(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, checkpoint_state,
                                records: KDARecoverSSMRecords, query_start_loc, state_indices, spec_query_len,
                                record_rows, pending, plan: CommitPlan, out=None):
    """``kda_recoverssm_flush`` then ``kda_recoverssm_verify(..., record_indices=record_rows)``
    (docs/design.md §7) with one read of each state tile: the state kernel folds a row's
    pending records into its tile, stores it in place and runs the window from it (for the
    fewest pairs, ``flush-apart``: the flush's fold, then verify, which consumes the counts).
    ``plan`` receives the flush plan; every pending count is consumed once."""
    check_pending_args(state_indices, record_rows, pending, plan, records=records)
    d = check_verify_args(q, k, v, raw_g, raw_beta, A_log, dt_bias, checkpoint_state, records,
                          query_start_loc, state_indices, spec_query_len, out, record_rows)
    if out is None:
        out = torch.zeros_like(v)
    if d.batch == 0:
        return out
    _launch(_call(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, checkpoint_state, records, query_start_loc,
                  state_indices, d, out, record_rows), pending, plan)
    return out
