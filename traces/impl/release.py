"""An implementation from a module with the released engine's stock surface (vLLM 0.33.0's
``vllm.models.kimi_k3.nvidia.ops.recoverssm``).

That module has ``kda_recoverssm_verify`` without ``record_indices`` (batch row ``b`` writes
record row ``b``), its ``KDARecoverSSMRecords`` and a ``KDARecoverSSMCommitContext`` whose
``create(layers, *, spec_query_len, max_num_reqs, backend="triton")`` reads each layer's
``kv_cache = (conv_state, checkpoint_state)`` and ``recoverssm_records``, takes the conv layout
from the module's global ``is_conv_state_dim_first()``, and keeps its plan as four columns of
its own (``commit_lens`` ...). ``ReleaseImpl`` turns it into the five-function API: verify runs
through the module; the plan, defer, commit and flush, which it lacks, through kda's kernels.
``ReleaseContext`` is kda's commit context surface over the module's: a trace's
``commit_layers`` events run through the module's ``create`` and ``commit``, records by batch
row under the release's align-mode rule (``kernels.commit_rules``); the plan it leaves in its
columns is copied to the trace's plan buffer. Under the Triton interpreter the module's state
commit cannot run (it addresses layers through pointer tables), so there its launch is
replaced, for the length of the call, by kda's fold of the same plan; the routes say so.
"""

from __future__ import annotations

import inspect
import os
import sys
from contextlib import contextmanager
from types import ModuleType, SimpleNamespace

from traces.impl.surface import KDA
from traces.ops.table import API

RELEASE_SURFACE = ("kda_recoverssm_verify", "KDARecoverSSMRecords", "KDARecoverSSMCommitContext")
"""What a module with the released stock surface has (and no ``record_indices`` in its verify)."""
PLAN_COLUMNS = ("commit_lens", "final_state_indices", "boundary_state_indices", "boundary_recovery_lens")
"""The release's commit context keeps its plan as these attributes of its own."""
RECORDS, RULE = "batch_row", "vllm-0.33.0"
"""How the release's commit addresses records, and its align-mode rule (``kernels.commit_rules``)."""
STATE_KERNEL = "_commit_kda_state_kernel"
"""The release's state commit launch, which the interpreter cannot run."""


def has_release_surface(module: ModuleType) -> bool:
    """Whether ``module`` has the released stock surface: ``RELEASE_SURFACE``, a verify that
    takes no ``record_indices``, and a commit context whose plan is its own columns."""
    if not all(hasattr(module, name) for name in RELEASE_SURFACE):
        return False
    try:
        verify = inspect.signature(module.kda_recoverssm_verify).parameters
    except (TypeError, ValueError):
        return False
    return "record_indices" not in verify and is_release_context(module.KDARecoverSSMCommitContext)


def is_release_context(cls) -> bool:
    """Whether commit context class ``cls`` is the release's: its ``create`` takes no
    ``conv_dim_first`` and its plan is ``PLAN_COLUMNS`` of its own (a dataclass's fields)."""
    fields = getattr(cls, "__dataclass_fields__", {})
    try:
        create = inspect.signature(cls.create).parameters
    except (AttributeError, TypeError, ValueError):
        return False
    return all(name in fields for name in PLAN_COLUMNS) and "conv_dim_first" not in create


def interpreted() -> bool:
    """Whether Triton kernels run through the interpreter here."""
    return os.environ.get("TRITON_INTERPRET") == "1"


class ReleaseImpl:
    """The five-function API over a released-surface ``module`` named ``name`` (module
    docstring). Records are the module's ``KDARecoverSSMRecords``, handed to kda's kernels as
    kda's over the same tensors."""

    def __init__(self, module: ModuleType, name: str):
        import kernels
        from kernels import buffers

        self.module, self.__name__, self._kda = module, name, kernels
        self.KDARecoverSSMRecords = module.KDARecoverSSMRecords
        self.CommitPlan = buffers.CommitPlan
        self.allocate_records = buffers.allocate_records
        self.NULL_BLOCK_ID = buffers.NULL_BLOCK_ID
        self.KDARecoverSSMCommitContext = release_context(module, name)
        own = {"kda_recoverssm_verify": f"{name} (kda_recoverssm_verify)"}
        self.routes = {op: own.get(function, KDA) for op, function in API.items()}

    def _records(self, records):
        return self._kda.KDARecoverSSMRecords(records.correction, records.key_gate)

    def kda_recoverssm_verify(self, q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, checkpoint_state, records,
                              query_start_loc, state_indices, spec_query_len, out=None, record_indices=None):
        """The module's verify; it writes record row ``b`` for batch row ``b``, so an event with
        ``record_indices`` (the seed's deferred path) cannot run through it (``ValueError``)."""
        if record_indices is not None:
            raise ValueError(f"{self.__name__}'s verify writes record row b for batch row b and takes no "
                             "record_indices, which this call passes (the deferred path, which the release does "
                             "not have): run it through triton")
        return self.module.kda_recoverssm_verify(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound,
                                                 checkpoint_state, self.KDARecoverSSMRecords(records.correction,
                                                                                             records.key_gate),
                                                 query_start_loc, state_indices, spec_query_len, out=out)

    def kda_recoverssm_plan(self, *args, **kwargs):
        return self._kda.kda_recoverssm_plan(*args, **kwargs)

    def kda_recoverssm_defer(self, *args, **kwargs):
        return self._kda.kda_recoverssm_defer(*args, **kwargs)

    def kda_recoverssm_commit(self, checkpoint_state, records, *args, **kwargs):
        return self._kda.kda_recoverssm_commit(checkpoint_state, self._records(records), *args, **kwargs)

    def kda_recoverssm_flush(self, checkpoint_state, records, *args, **kwargs):
        return self._kda.kda_recoverssm_flush(checkpoint_state, self._records(records), *args, **kwargs)


def release_context(module: ModuleType, name: str) -> type:
    """``ReleaseContext`` over ``module``'s commit context class (routes named ``name``)."""
    return type("ReleaseContext", (ReleaseContext,), {"module": module, "route": context_route(name)})


def context_route(name: str) -> str:
    """How the routes name the release's commit of every layer here."""
    if interpreted():
        return (f"{name} (KDARecoverSSMCommitContext: plan, conv) + {KDA} (state commit: the interpreter cannot run "
                "the release's pointer tables)")
    return f"{name} (KDARecoverSSMCommitContext)"


class ReleaseContext:
    """kda's commit context surface (``kernels.context.engine``: ``create``, ``plan``,
    ``commit``) over the release's ``KDARecoverSSMCommitContext`` (``module``): records by
    batch row, the release's align-mode rule."""

    module: ModuleType
    route: str

    def __init__(self, context, plan):
        self.context, self.plan = context, plan

    @classmethod
    def create(cls, layers, spec_query_len: int, max_num_reqs: int, conv_dim_first: bool = True,
               records: str = RECORDS, rule: str = RULE) -> "ReleaseContext":
        """The module's ``create`` over ``layers`` (``kernels.context.engine.CommitLayer``s),
        with the module's conv layout global set to ``conv_dim_first`` while it runs. Raises
        ``ValueError`` for records or a rule the release does not follow."""
        from kernels.buffers import CommitPlan

        if (records, rule) != (RECORDS, RULE):
            raise ValueError(f"the released commit context folds records by {RECORDS} under the {RULE} rule; this "
                             f"trace's commit keeps records by {records} under the {rule} rule: replay it through "
                             "triton")
        release = [SimpleNamespace(kv_cache=(layer.kv_cache[0], layer.kv_cache[1]),
                                   recoverssm_records=cls.module.KDARecoverSSMRecords(*layer.kv_cache[2:4]),
                                   A_log=layer.A_log, dt_bias=layer.dt_bias, local_num_heads=layer.local_num_heads,
                                   head_dim=layer.head_dim, gate_lower_bound=layer.gate_lower_bound)
                   for layer in layers]
        with _replaced(cls.module, "is_conv_state_dim_first", lambda: conv_dim_first):
            context = cls.module.KDARecoverSSMCommitContext.create(release, spec_query_len=spec_query_len,
                                                                   max_num_reqs=max_num_reqs)
        return cls(context, CommitPlan.allocate(max_num_reqs, layers[0].kv_cache[1].device))

    def commit(self, num_accepted_tokens, state_indices, query_start_loc, request_indices=None, block_table=None,
               num_computed_tokens=None, mamba_block_size=None) -> None:
        """The module's ``commit``; then its plan columns' first ``B`` rows to ``plan``."""
        import torch

        B = state_indices.shape[0]
        with interpreter_state_commit(self.context, state_indices):
            self.context.commit(num_accepted_tokens, state_indices, query_start_loc, request_indices=request_indices,
                                block_table=block_table, num_computed_tokens=num_computed_tokens,
                                mamba_block_size=mamba_block_size)
        torch._foreach_copy_([getattr(self.plan, c)[:B] for c in PLAN_COLUMNS],
                             [getattr(self.context, c)[:B] for c in PLAN_COLUMNS])  # one launch


@contextmanager
def interpreter_state_commit(context, state_indices):
    """Under the Triton interpreter, which cannot run the release's state commit (it reads its
    layers through pointer tables), that launch of ``context.commit`` (``context``: a release
    commit context, or of a subclass; ``state_indices`` the commit's) replaced, inside the
    block, by kda's fold of the plan the release's commit leaves, on the context's own
    buffers: each layer's records of batch row ``b``, rows with a null final slot folding
    nothing (the release's rule). Elsewhere nothing is replaced."""
    if not interpreted():
        yield
        return
    module = next(sys.modules[c.__module__] for c in type(context).__mro__
                  if hasattr(sys.modules.get(c.__module__), STATE_KERNEL))
    with _replaced(module, STATE_KERNEL, _KdaStateCommit(context, state_indices)):
        yield


class _KdaStateCommit:
    """Stands for the release's state commit kernel: ``kernel[grid](*args)`` runs ``run``."""

    def __init__(self, context, state_indices):
        self.context, self.state_indices = context, state_indices

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.run()

    def run(self) -> None:
        from kernels import kda_recoverssm_commit
        from kernels.buffers import CommitPlan, KDARecoverSSMRecords
        from kernels.commit_rules import release_folds

        ctx, B = self.context, self.state_indices.shape[0]
        stored = CommitPlan(*(getattr(ctx, column)[:B] for column in PLAN_COLUMNS))
        plan = release_folds(stored, CommitPlan.allocate(B, ctx.commit_lens.device))
        for layer, state in enumerate(ctx.checkpoints):
            records = KDARecoverSSMRecords(ctx.correction_caches[layer], ctx.kg_caches[layer])
            kda_recoverssm_commit(state, records, ctx.A_log[layer], ctx.dt_bias[layer].reshape(-1), ctx.lower_bound,
                                  self.state_indices, plan)


@contextmanager
def _replaced(module: ModuleType, name: str, value):
    """``module.name`` is ``value`` inside the block."""
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


__all__ = ["PLAN_COLUMNS", "RECORDS", "RELEASE_SURFACE", "RULE", "ReleaseContext", "ReleaseImpl",
           "has_release_surface", "interpreter_state_commit", "is_release_context"]
