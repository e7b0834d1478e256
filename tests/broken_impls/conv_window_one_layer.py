"""kda's surface with a commit context whose conv-state compaction is wrong in one layer: after
each commit, layer 1's conv window of the first slot it wrote has entry 0 of channel 0 one
higher. As an engine's module (``tests/support/context_engine.py --module``) its recording expects
the wrong window; as ``--impl`` it computes it."""

from kernels import *  # noqa: F401,F403  (the whole API)
from kernels.context.engine import KDARecoverSSMCommitContext as _Context
from traces.record.recorder import written_slots

BROKEN_LAYER = 1


class KDARecoverSSMCommitContext(_Context):
    def _apply(self, num_accepted_tokens, state_indices, query_start_loc, requests, block_table, num_computed_tokens,
               mamba_block_size) -> None:
        super()._apply(num_accepted_tokens, state_indices, query_start_loc, requests, block_table,
                       num_computed_tokens, mamba_block_size)
        slots = written_slots(self.plan, state_indices, state_indices)
        if slots.numel():
            self.conv.states[BROKEN_LAYER][int(slots[0]), 0, 0] += 1
