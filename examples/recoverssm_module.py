"""The example engine's RecoverSSM module, as a serving engine carries it.

It exposes the documented surface (``kda_recoverssm_verify``, ``KDARecoverSSMRecords``,
``_defer_commit_kernel``, ``_prepare_flush_plan_kernel``; docs/implementations.md) and the plan,
commit and buffers the engine uses, all kda's own. ``examples/serve_engine.py`` calls it only
through these attributes, so ``kda record run --patch examples.recoverssm_module`` records the
engine unedited, and ``kda replay --impl examples/recoverssm_module.py`` replays through it.

``KDA_EXAMPLE_BUG=commit-len``, read at import, turns on a bug to reproduce: a stale per-slot
cache makes the commit fold one record too many (``n + 1``, at most ``T``) on each row whose
slot was last committed for another record row (a slot reused by a new request). The cache
reads the plan on the host, so that commit cannot be captured in a CUDA graph.
"""

from __future__ import annotations

import os

from kernels import (
    NULL_BLOCK_ID,
    CommitPlan,
    KDARecoverSSMRecords,
    _defer_commit_kernel,
    _prepare_flush_plan_kernel,
    allocate_records,
    kda_recoverssm_plan,
    kda_recoverssm_verify,
)
from kernels import kda_recoverssm_commit as _kda_commit

BUG_VARIABLE = "KDA_EXAMPLE_BUG"
BUGS = ("commit-len",)


class StaleSlotCommit:
    """``kda_recoverssm_commit`` with the ``commit-len`` bug: it remembers, per state pool and
    slot, the record row it last folded into that slot; a row whose slot it remembers for
    another record row folds ``min(commit_lens[b] + 1, T)`` records. Rows that fold nothing
    leave the cache alone."""

    def __init__(self):
        self.last_row: dict[tuple[int, int], int] = {}

    def __call__(self, checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, plan,
                 record_indices=None) -> None:
        B = state_indices.shape[0]
        rows = record_indices.tolist() if record_indices is not None else list(range(B))
        lens = plan.commit_lens[:B].to("cpu", copy=True)
        for b, (slot, row) in enumerate(zip(state_indices.tolist(), rows)):
            if slot <= NULL_BLOCK_ID or row < 0 or lens[b] <= 0:
                continue
            key = (checkpoint_state.data_ptr(), slot)
            if self.last_row.get(key, row) != row:
                lens[b] = min(int(lens[b]) + 1, records.spec_query_len)
            self.last_row[key] = row
        stale = CommitPlan(lens.to(plan.commit_lens.device), plan.final_state_indices[:B],
                           plan.boundary_state_indices[:B], plan.boundary_recovery_lens[:B])
        _kda_commit(checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, stale,
                    record_indices=record_indices)


def _commit_for(bug: str):
    if bug == "":
        return _kda_commit
    if bug == "commit-len":
        return StaleSlotCommit()
    raise ValueError(f"{BUG_VARIABLE}={bug}: expected one of {', '.join(BUGS)} (or unset)")


kda_recoverssm_commit = _commit_for(os.environ.get(BUG_VARIABLE, ""))

__all__ = ["BUGS", "BUG_VARIABLE", "NULL_BLOCK_ID", "CommitPlan", "KDARecoverSSMRecords", "StaleSlotCommit",
           "_defer_commit_kernel", "_prepare_flush_plan_kernel", "allocate_records", "kda_recoverssm_commit",
           "kda_recoverssm_plan", "kda_recoverssm_verify"]
