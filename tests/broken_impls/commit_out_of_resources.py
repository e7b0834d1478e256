"""The reference, except that a commit folding three or more records raises Triton's
``OutOfResources`` (a ``TritonError``, not a ``RuntimeError``), as a launch whose shared
memory does not fit would."""

from triton.runtime.errors import OutOfResources

from kernels.reference import *  # noqa: F401,F403  (the whole API)
from kernels.reference import kda_recoverssm_commit as _commit


def kda_recoverssm_commit(checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, plan,
                          record_indices=None):
    if int(plan.commit_lens[: state_indices.shape[0]].max()) >= 3:
        raise OutOfResources(233472 + 1024, 233472, "shared memory")
    return _commit(checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, plan, record_indices)
