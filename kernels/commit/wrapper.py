"""RecoverSSM commit: fold recorded tokens into checkpoint slots (docs/design.md §3, §6).

Folding is ``S_n = S_0 exp(G_n) + U F_n`` (``kernels.commit.fold``), whose operand ``F_n`` depends on
a row's records alone, not on the state. Three designs, one module each, chosen by
``kernels.launch`` (docs/design.md §9):

- ``kernels.commit.token_loop``: the records one token at a time on a state tile held in
  registers, for the fewest tokens;
- ``kernels.commit.fold_in_tile``: one launch, each V-tile rebuilding ``F`` beside its state
  blocks, for few (row, head) pairs;
- ``kernels.commit.fold_operand_once``: ``F`` built once per (row, head, block of key
  channels), then the state kernel, for many.

Rows with a boundary slot take both folds from one read of each block (the boundary slot may
be the source), in narrower blocks of ``BOUNDARY_BKK`` so that this rarer path does not set
the kernel's register count. Records past a fold's length are masked out before they are
read, so NaN there is inert.
"""

from __future__ import annotations

from kernels.buffers import CommitPlan, KDARecoverSSMRecords
from kernels.commit.fold_in_tile import launch_fold_in_tile
from kernels.commit.fold_operand_once import launch_fold_operand_once
from kernels.commit.row import CommitCall
from kernels.commit.token_loop import launch_token_loop
from kernels.contract import check_commit_args
from kernels.launch import Target, commit_config


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
    plan_rows = (plan.commit_lens, plan.final_state_indices, plan.boundary_state_indices, plan.boundary_recovery_lens)
    call = CommitCall(checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, record_indices, plan_rows,
                      None, B, H, K, V, records.spec_query_len)
    cfg = commit_config(B, H, K, V, call.T, Target.of(checkpoint_state.device))
    if cfg.design == "token-loop":
        launch_token_loop(call, cfg)
    elif cfg.design == "fold-in-tile":
        launch_fold_in_tile(call, cfg)
    else:
        launch_fold_operand_once(call, cfg)


def fold_pending(checkpoint_state, records: KDARecoverSSMRecords, A_log, dt_bias, lower_bound, state_indices,
                 record_rows, pending) -> None:
    """Fold each row's pending records (``pending[record_rows[b]]`` of them, as a flush plans
    the count) into its slot in place, in one launch of the commit's token loop on its tiles
    for ``B`` rows. Unlike ``kda_recoverssm_flush`` it neither consumes the counts nor writes a
    plan: the caller's next launch must (the flushing verify's flush apart). Arguments as
    ``kda_recoverssm_flush``'s, already checked."""
    B, (_, H, V, K) = state_indices.shape[0], checkpoint_state.shape
    call = CommitCall(checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, record_rows, (None,) * 4,
                      pending, B, H, K, V, records.spec_query_len)
    launch_token_loop(call, commit_config(B, H, K, V, call.T, Target.of(checkpoint_state.device), design="token-loop"))
