"""An implementation from a module that has only the documented surface.

A serving engine's RecoverSSM module exposes ``kda_recoverssm_verify``,
``KDARecoverSSMRecords`` and the two raw kernels ``_defer_commit_kernel`` and
``_prepare_flush_plan_kernel``, which the engine launches itself. ``SurfaceImpl`` turns such a
module into the five-function API: verify, defer and the flush plan run through the module's
own function and kernels, launched as documented (grid ``(B,)``, positional arguments); the
stock plan, the commit and the commit half of a flush run through kda's Triton kernels. A
module's own ``KDARecoverSSMCommitContext`` is kept (``traces.replay.commit_context`` runs
a trace's commit of every layer through it). ``routes`` says which op ran where.
"""

from __future__ import annotations

import re
from types import ModuleType

from traces.ops.table import API

SURFACE = ("kda_recoverssm_verify", "KDARecoverSSMRecords", "_defer_commit_kernel", "_prepare_flush_plan_kernel")
"""What a module must have to be used through ``SurfaceImpl``."""

KDA = "triton"
"""How the routes name kda's own kernels (the ``--impl`` name of the ``kernels`` package)."""


def has_surface(module: ModuleType) -> bool:
    return all(hasattr(module, name) for name in SURFACE)


class SurfaceImpl:
    """The five-function API over a documented-surface ``module`` named ``name``.

    Buffers are the module's ``KDARecoverSSMRecords`` and kda's ``CommitPlan``; records are
    handed to kda's kernels as kda's ``KDARecoverSSMRecords`` over the same tensors.
    """

    def __init__(self, module: ModuleType, name: str):
        import kernels
        from kernels import buffers

        self.module, self.__name__, self._kda = module, name, kernels
        self.KDARecoverSSMRecords = module.KDARecoverSSMRecords
        self.CommitPlan = buffers.CommitPlan
        self.allocate_records = getattr(module, "allocate_records", None) or buffers.allocate_records
        self.NULL_BLOCK_ID = getattr(module, "NULL_BLOCK_ID", buffers.NULL_BLOCK_ID)
        self.KDARecoverSSMCommitContext = getattr(module, "KDARecoverSSMCommitContext", None)
        own = {"kda_recoverssm_verify": f"{name} (kda_recoverssm_verify)",
               "kda_recoverssm_defer": f"{name} (_defer_commit_kernel)",
               "kda_recoverssm_flush": f"{name} (_prepare_flush_plan_kernel) + {KDA} (commit)"}
        self.routes = {op: own.get(function, KDA) for op, function in API.items()}

    def _records(self, records):
        return self._kda.KDARecoverSSMRecords(records.correction, records.key_gate)

    def kda_recoverssm_verify(self, *args, **kwargs):
        return self.module.kda_recoverssm_verify(*args, **kwargs)

    def kda_recoverssm_plan(self, plan, num_accepted, query_start_loc, state_indices, spec_query_len,
                            block_table=None, num_computed=None, block_size=None):
        return self._kda.kda_recoverssm_plan(plan, num_accepted, query_start_loc, state_indices, spec_query_len,
                                             block_table, num_computed, block_size)

    def kda_recoverssm_defer(self, plan, state_indices, record_rows, pending, eager=None) -> None:
        from kernels.contract import check_pending_args

        B = check_pending_args(state_indices, record_rows, pending, plan, eager)
        if B:
            self.module._defer_commit_kernel[(B,)](state_indices, plan.commit_lens, record_rows, pending, eager,
                                                   self.NULL_BLOCK_ID, state_indices.stride(0))

    def kda_recoverssm_commit(self, checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, plan,
                              record_indices=None) -> None:
        self._kda.kda_recoverssm_commit(checkpoint_state, self._records(records), A_log, dt_bias, lower_bound,
                                        state_indices, plan, record_indices=record_indices)

    def kda_recoverssm_flush(self, checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices,
                             record_rows, pending, plan, consume_pending=True) -> None:
        """The module's flush plan kernel, then kda's commit. The documented kernel leaves the
        counts; ``consume_pending`` then zeroes those it planned, as kda's own flush does."""
        from kernels.contract import check_pending_args

        B = check_pending_args(state_indices, record_rows, pending, plan)
        if B:
            self.module._prepare_flush_plan_kernel[(B,)](
                state_indices, record_rows, pending, plan.commit_lens, plan.final_state_indices,
                plan.boundary_state_indices, plan.boundary_recovery_lens, self.NULL_BLOCK_ID,
                state_indices.stride(0), records.correction.shape[2])
        self.kda_recoverssm_commit(checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, plan,
                                   record_indices=record_rows)
        if consume_pending and B:
            live = (state_indices[:B] > self.NULL_BLOCK_ID) & (record_rows[:B] >= 0)
            pending[record_rows[:B][live].long()] = 0


_ROUTE_PART = re.compile(r"(.*) \(([^()]*)\)")
"""A route's part: ``NAME`` or ``NAME (function)``; a route is one part or two joined by ``" + "``."""


def routes_by_implementation(routes: dict[str, str]) -> dict[str, list[str]]:
    """``routes`` (op -> the implementation it runs through, ``traces.impl.loader.op_routes``'
    words) turned round: implementation -> its ops, in order, each with the function it runs in
    parentheses where the route names one (``flush (commit)``); an op of a two-part route is
    under both."""
    grouped: dict[str, list[str]] = {}
    for op, route in routes.items():
        for part in route.split(" + "):
            match = _ROUTE_PART.fullmatch(part)
            name, function = (match[1], match[2]) if match else (part, "")
            grouped.setdefault(name, []).append(f"{op} ({function})" if function else op)
    return grouped
