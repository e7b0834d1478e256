"""The reference, except that verify also writes the records of a row's tokens past its
window: a stray write that only the final buffers show, since an event's expected records
cover the window's tokens alone."""

import torch

from kernels.reference import *  # noqa: F401,F403  (the whole API)
from kernels.reference import kda_recoverssm_verify as _verify


def kda_recoverssm_verify(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, checkpoint_state, records,
                          query_start_loc, state_indices, spec_query_len, out=None, record_indices=None):
    out = _verify(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, checkpoint_state, records, query_start_loc,
                  state_indices, spec_query_len, out, record_indices)
    rows = record_indices if record_indices is not None else torch.arange(state_indices.shape[0])
    lengths = (query_start_loc[1:] - query_start_loc[:-1]).tolist()
    for slot, row, length in zip(state_indices.tolist(), rows.tolist(), lengths):
        if slot > 0 and row >= 0 and length < spec_query_len:
            records.correction[row, :, length:] = 1.0
    return out
