"""Commit plans (docs/design.md §6, §7): the small integer kernels that write a ``CommitPlan`` for
a step (``steps``: the stock plan, align mode included, deferral into pending counts, both in one
launch, the flush plan) and the raw defer and flush plan kernels engines launch themselves;
``flush_row`` is the flush's plan row that every kernel planning a flush shares."""

from kernels.plan.steps import (
    RequestPlan,
    defer_commit_kernel,
    kda_recoverssm_defer,
    kda_recoverssm_plan,
    kda_recoverssm_plan_deferred,
    plan_per_request,
    prepare_flush_plan,
    prepare_flush_plan_kernel,
)

__all__ = ["kda_recoverssm_plan", "kda_recoverssm_defer", "kda_recoverssm_plan_deferred", "defer_commit_kernel",
           "prepare_flush_plan_kernel", "prepare_flush_plan", "plan_per_request", "RequestPlan"]
