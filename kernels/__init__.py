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
                            (float64 reference: ``kernels.context.reference``)

The raw kernels engines launch themselves, one program a batch row (docs/implementations.md;
an engine module exports them as ``_defer_commit_kernel`` and ``_prepare_flush_plan_kernel``)::

    defer_commit_kernel         kda_recoverssm_defer's row logic
    prepare_flush_plan_kernel   the flush plan, reading ``pending`` and never writing it

Ops live in sub-packages (``verify``, ``commit``, ``plan``, ``context``); the modules at this
level are what they share.
"""

from kernels.buffers import NULL_BLOCK_ID, CommitPlan, KDARecoverSSMRecords, allocate_records
from kernels.commit import kda_recoverssm_commit, kda_recoverssm_flush
from kernels.context import KDARecoverSSMCommitContext, LayerBuffers, LayerTables, kda_recoverssm_commit_layers
from kernels.plan import (
    defer_commit_kernel,
    kda_recoverssm_defer,
    kda_recoverssm_plan,
    kda_recoverssm_plan_deferred,
    prepare_flush_plan_kernel,
)
from kernels.verify import kda_recoverssm_flush_verify, kda_recoverssm_verify

__all__ = [
    "NULL_BLOCK_ID", "CommitPlan", "KDARecoverSSMRecords", "allocate_records",
    "kda_recoverssm_verify", "kda_recoverssm_plan", "kda_recoverssm_defer", "kda_recoverssm_plan_deferred",
    "kda_recoverssm_commit",
    "kda_recoverssm_flush", "kda_recoverssm_flush_verify", "defer_commit_kernel", "prepare_flush_plan_kernel",
    "kda_recoverssm_commit_layers", "LayerBuffers", "LayerTables", "KDARecoverSSMCommitContext",
]
