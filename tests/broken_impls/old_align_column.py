"""The reference, except that the align-mode plan sends the fold to column ``c_end // bs``
(the old formula: one column too far when the window ends exactly on a block boundary)."""

import torch

from kernels.reference import *  # noqa: F401,F403  (the whole API)
from kernels.reference import kda_recoverssm_plan as _plan


def kda_recoverssm_plan(plan, num_accepted, query_start_loc, state_indices, spec_query_len, block_table=None,
                        num_computed=None, block_size=None):
    rows = _plan(plan, num_accepted, query_start_loc, state_indices, spec_query_len, block_table, num_computed,
                 block_size)
    if block_table is None:
        return rows
    c_end = num_computed.long() + rows.commit_lens.long()
    col = (c_end // block_size).clamp(max=block_table.shape[1] - 1)
    old = block_table.long().gather(1, col[:, None]).squeeze(1)
    valid = rows.commit_lens > 0
    rows.final_state_indices.copy_(torch.where(valid, old, rows.final_state_indices.long()))
    return rows
