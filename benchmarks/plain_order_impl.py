"""The shipped kernels launched in plain stream order, for side-by-side timing of dependent
launch: ``kda bench --impl triton,benchmarks/plain_order_impl.py``.

Each API call runs with ``KDA_DEPENDENT_LAUNCH=0`` (``kernels.dependent_launch``), so a CUDA
graph captured through it holds no programmatic dependencies.
"""

import functools
import os

import kernels
from kernels import CommitPlan, KDARecoverSSMRecords, NULL_BLOCK_ID, allocate_records  # noqa: F401

_SWITCH = "KDA_DEPENDENT_LAUNCH"


def _in_plain_order(fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        before = os.environ.get(_SWITCH)
        os.environ[_SWITCH] = "0"
        try:
            return fn(*args, **kwargs)
        finally:
            if before is None:
                del os.environ[_SWITCH]
            else:
                os.environ[_SWITCH] = before
    return call


kda_recoverssm_verify = _in_plain_order(kernels.kda_recoverssm_verify)
kda_recoverssm_plan = _in_plain_order(kernels.kda_recoverssm_plan)
kda_recoverssm_defer = _in_plain_order(kernels.kda_recoverssm_defer)
kda_recoverssm_commit = _in_plain_order(kernels.kda_recoverssm_commit)
kda_recoverssm_flush = _in_plain_order(kernels.kda_recoverssm_flush)
kda_recoverssm_flush_verify = _in_plain_order(kernels.kda_recoverssm_flush_verify)
