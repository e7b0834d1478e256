"""The released vLLM 0.33.0 module (``tests.support.vllm_release`` puts it on the path) with a commit
context whose commit corrupts one layer: after each commit, layer 1's state at the first slot
the plan wrote has element (head 0, v 1, k 2) one higher. As an engine's module
(``examples/vllm_engine.py --module``) its recording expects the wrong state."""

import torch

from vllm.models.kimi_k3.nvidia.ops.recoverssm import KDARecoverSSMCommitContext as _Context
from vllm.models.kimi_k3.nvidia.ops.recoverssm import (  # noqa: F401  (the released surface)
    KDARecoverSSMRecords, is_conv_state_dim_first, kda_recoverssm_verify)

BROKEN_LAYER = 1


class KDARecoverSSMCommitContext(_Context):
    def commit(self, num_accepted_tokens, state_indices, query_start_loc, request_indices=None, block_table=None,
               num_computed_tokens=None, mamba_block_size=None) -> None:
        super().commit(num_accepted_tokens, state_indices, query_start_loc, request_indices, block_table,
                       num_computed_tokens, mamba_block_size)
        B = state_indices.shape[0]
        written = self.final_state_indices[:B][self.commit_lens[:B] > 0]
        if written.numel():
            self.checkpoints[BROKEN_LAYER][int(written[0]), 0, 1, 2] += torch.ones((), dtype=torch.float32)
