"""The flush (docs/design.md §7): the flush plan of each row's pending count, then the commit
that folds those records into the row's own slot in place."""

from __future__ import annotations

from kernels.buffers import CommitPlan, KDARecoverSSMRecords
from kernels.commit.wrapper import kda_recoverssm_commit
from kernels.contract import check_flush_args
from kernels.plan.steps import prepare_flush_plan


def kda_recoverssm_flush(checkpoint_state, records: KDARecoverSSMRecords, A_log, dt_bias, lower_bound,
                         state_indices, record_rows, pending, plan: CommitPlan, consume_pending: bool = True) -> None:
    """Fold each row's pending records into its slot in place. kda's contract consumes each
    count folded (zeroes it); ``consume_pending=False`` leaves ``pending`` as the documented
    flush plan kernel does (docs/design.md §7)."""
    check_flush_args(checkpoint_state, records, A_log, dt_bias, state_indices, record_rows, pending, plan)
    prepare_flush_plan(plan, state_indices, record_rows, pending, records.spec_query_len, consume_pending)
    kda_recoverssm_commit(checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, plan,
                          record_indices=record_rows)
