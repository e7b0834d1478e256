"""The reference, except that flush folds the pending records but leaves the counts in place
(a replay of the same window on the next flush)."""

from kernels.reference import *  # noqa: F401,F403  (the whole API)
from kernels.reference import _prepare_flush_plan, kda_recoverssm_commit


def kda_recoverssm_flush(checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, record_rows, pending,
                         plan):
    kept = pending.clone()
    _prepare_flush_plan(plan, state_indices, record_rows, pending, records.spec_query_len)
    pending.copy_(kept)
    kda_recoverssm_commit(checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, plan,
                          record_indices=record_rows)
