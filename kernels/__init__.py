"""Triton kernels of KDA RecoverSSM and their float64-capable torch reference.

The public API (the same names in ``kernels.reference``)::

    kda_recoverssm_verify   run a speculative window from a read-only checkpoint
    kda_recoverssm_plan     stock commit plan (align mode included)
    kda_recoverssm_defer    move commit lengths into per-request pending counts
    kda_recoverssm_plan_deferred
                            plan, then defer, in one launch
    kda_recoverssm_commit   fold records into checkpoint slots
    kda_recoverssm_flush    fold and consume every pending count
    kda_recoverssm_flush_verify
                            flush, then verify from the flushed state, in one pass over it

Beyond that API (``kernels`` only, docs/design.md §10)::

    kda_recoverssm_commit_layers
                            one plan committed into every layer of ``LayerTables``
    KDARecoverSSMCommitContext
                            the engine's commit of every layer: plan, conv state, state
                            (float64 reference: ``kernels.reference_context``)
"""

from kernels.buffers import NULL_BLOCK_ID, CommitPlan, KDARecoverSSMRecords, allocate_records
from kernels.commit import kda_recoverssm_commit
from kernels.commit_context import KDARecoverSSMCommitContext
from kernels.commit_layers import LayerBuffers, LayerTables, kda_recoverssm_commit_layers
from kernels.plan import (
    _defer_commit_kernel,
    _prepare_flush_plan_kernel,
    kda_recoverssm_defer,
    kda_recoverssm_flush,
    kda_recoverssm_plan,
    kda_recoverssm_plan_deferred,
)
from kernels.verify import kda_recoverssm_flush_verify, kda_recoverssm_verify

__all__ = [
    "NULL_BLOCK_ID", "CommitPlan", "KDARecoverSSMRecords", "allocate_records",
    "kda_recoverssm_verify", "kda_recoverssm_plan", "kda_recoverssm_defer", "kda_recoverssm_plan_deferred",
    "kda_recoverssm_commit",
    "kda_recoverssm_flush", "kda_recoverssm_flush_verify", "_defer_commit_kernel", "_prepare_flush_plan_kernel",
    "kda_recoverssm_commit_layers", "LayerBuffers", "LayerTables", "KDARecoverSSMCommitContext",
]
