"""The reference, except that a commit folding three or more records raises, as a kernel
that faults on long windows would."""

from kernels.reference import *  # noqa: F401,F403  (the whole API)
from kernels.reference import kda_recoverssm_commit as _commit


def kda_recoverssm_commit(checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, plan,
                          record_indices=None):
    if int(plan.commit_lens[: state_indices.shape[0]].max()) >= 3:
        raise RuntimeError("illegal memory access (simulated)")
    return _commit(checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, plan, record_indices)
