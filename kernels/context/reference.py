"""Torch reference of the engine's commit (``kernels.context.engine``): the same context,
its three steps run by ``kernels.reference`` and ``compact_conv_states`` below, in float64
where the buffers are float64."""

from __future__ import annotations

import torch

from kernels import reference
from kernels.buffers import NULL_BLOCK_ID, CommitPlan
from kernels.commit_rules import apply_rule
from kernels.context.engine import KDARecoverSSMCommitContext


def compact_conv_states(states, history: int, state_indices, plan: CommitPlan) -> None:
    """For each row that commits (``commit_lens[b] = n > 0``, real source and final slots):
    entries ``n - 1 .. n + history - 2`` of the source's ``[dim, S]`` conv state become
    entries ``0 .. history - 1`` of the final slot's, and with a real boundary slot, entries
    ``R - 1 ..`` of the boundary's; ``states`` are ``[N, dim, S]`` views, one a layer."""
    for b in range(state_indices.shape[0]):
        source, n = int(state_indices[b]), int(plan.commit_lens[b])
        final, boundary = int(plan.final_state_indices[b]), int(plan.boundary_state_indices[b])
        recovery = int(plan.boundary_recovery_lens[b])
        if source <= NULL_BLOCK_ID or n <= 0 or final <= NULL_BLOCK_ID:
            continue
        for conv in states:
            window = conv[source, :, n - 1:n - 1 + history].clone()
            if boundary > NULL_BLOCK_ID and 0 < recovery <= n:  # read before any write: it may be the source
                conv[boundary, :, :history] = conv[source, :, recovery - 1:recovery - 1 + history].clone()
            conv[final, :, :history] = window


class ReferenceCommitContext(KDARecoverSSMCommitContext):
    """``KDARecoverSSMCommitContext`` whose steps are the torch reference's: the plan of
    ``kernels.reference`` on the rows' requests and the context's rule
    (``kernels.commit_rules.apply_rule``), ``compact_conv_states``, then
    ``kernels.reference.kda_recoverssm_commit`` layer by layer (records per slot or per
    batch row, as the context keeps them)."""

    def _apply(self, num_accepted_tokens, state_indices, query_start_loc, requests, block_table, num_computed_tokens,
               mamba_block_size) -> None:
        B = state_indices.shape[0]
        rows = torch.arange(B, device=state_indices.device) if requests is None else requests.long()
        align = {}
        if block_table is not None:
            align = dict(block_table=block_table[rows].contiguous(),
                         num_computed=num_computed_tokens[rows].contiguous(), block_size=mamba_block_size)
        plan = reference.kda_recoverssm_plan(self.plan, num_accepted_tokens[rows].contiguous(), query_start_loc,
                                             state_indices, self.spec_query_len, **align)
        if block_table is not None:
            plan = apply_rule(self.rule, plan, self.folds, requests, num_computed_tokens, mamba_block_size)
        record_rows = None
        if self.records == "slot":
            self.slot_rows[:B] = state_indices
            record_rows = self.slot_rows[:B]
        compact_conv_states(self.conv.states, self.conv.history, state_indices, plan)
        for layer in self.tables.layers:
            reference.kda_recoverssm_commit(layer.checkpoint_state, layer.records, layer.A_log, layer.dt_bias,
                                            self.lower_bound, state_indices, plan, record_rows)
