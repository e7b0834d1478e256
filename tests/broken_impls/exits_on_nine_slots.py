"""The reference, except that verify ends the process (``os._exit(1)``, as a crash would) when
the state pool has nine slots: a corpus test keys one trace's crash on its shape."""

import os

from kernels.reference import *  # noqa: F401,F403  (the whole API)
from kernels.reference import kda_recoverssm_verify as _verify

CRASH_SLOTS = 9


def kda_recoverssm_verify(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, checkpoint_state, *args, **kwargs):
    if checkpoint_state.shape[0] == CRASH_SLOTS:
        os._exit(1)
    return _verify(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, checkpoint_state, *args, **kwargs)
