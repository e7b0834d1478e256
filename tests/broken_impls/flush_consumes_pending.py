"""The reference, except that flush zeroes the pending counts it folds even when asked to keep
them, as a flush plan kernel that writes ``pending`` would (docs/design.md §7)."""

from kernels.reference import *  # noqa: F401,F403  (the whole API)
from kernels.reference import _prepare_flush_plan, kda_recoverssm_commit


def kda_recoverssm_flush(checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, record_rows, pending,
                         plan, consume_pending=True):
    _prepare_flush_plan(plan, state_indices, record_rows, pending, records.spec_query_len, consume=True)
    kda_recoverssm_commit(checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, plan,
                          record_indices=record_rows)
