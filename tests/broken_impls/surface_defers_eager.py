"""The documented surface, except that ``_defer_commit_kernel`` ignores ``eager``: eager rows
are deferred too, so their windows are never committed at the step."""

import triton
import triton.language as tl

from kernels import KDARecoverSSMRecords, kda_recoverssm_verify  # noqa: F401
from kernels import prepare_flush_plan_kernel as _prepare_flush_plan_kernel  # noqa: F401
from kernels.plan.steps import defer_batch_rows


@triton.heuristics({"HAS_EAGER": lambda args: args["eager_ptr"] is not None})
@triton.jit
def _defer_commit_kernel(state_indices_ptr, commit_lens_ptr, record_rows_ptr, pending_ptr, eager_ptr,
                         null_block_id, stride_state_indices, HAS_EAGER: tl.constexpr):
    b = tl.program_id(0)
    defer_batch_rows(b, b >= 0, state_indices_ptr, commit_lens_ptr, record_rows_ptr, pending_ptr, eager_ptr,
                     null_block_id, stride_state_indices, False)
