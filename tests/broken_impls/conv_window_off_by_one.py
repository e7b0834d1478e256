"""kda's kernels, with a commit context whose conv-state compaction reads each window one
position early: the entries up to accepted token ``n - 1`` instead of ``n`` (a row with one
accepted token keeps its old window)."""

from kernels import *  # noqa: F401,F403  (the whole API)
from kernels.buffers import CommitPlan
from kernels.context.engine import KDARecoverSSMCommitContext as _Context
from kernels.context.layers import kda_recoverssm_commit_layers
from kernels.context.reference import compact_conv_states
from kernels.plan.steps import plan_per_request


class KDARecoverSSMCommitContext(_Context):
    def _apply(self, num_accepted_tokens, state_indices, query_start_loc, requests, block_table, num_computed_tokens,
               mamba_block_size) -> None:
        B = state_indices.shape[0]
        plan = plan_per_request(self.plan, num_accepted_tokens, query_start_loc, state_indices, self.spec_query_len,
                                requests, self.slot_rows, block_table, num_computed_tokens, mamba_block_size)
        early = CommitPlan(plan.commit_lens - 1, plan.final_state_indices, plan.boundary_state_indices,
                           plan.boundary_recovery_lens)
        compact_conv_states(self.conv.states, self.conv.history, state_indices, early)
        kda_recoverssm_commit_layers(self.tables, self.lower_bound, state_indices, plan, self.slot_rows[:B])
