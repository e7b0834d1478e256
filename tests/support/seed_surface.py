"""An engine module whose two raw kernels are the documented ones, written apart from kda's
straight from their contract (docs/design.md §7): one program per batch row, no shared
helpers. The defer kernel moves a row's planned length into its pending count (or clears
the count for an eager row) and zeroes the planned length; the flush plan kernel plans a
fold of each row's count in place and never writes ``pending``. Verify and the records type
are kda's (``kda replay --impl tests/support/seed_surface.py``)."""

import triton
import triton.language as tl

from kernels import KDARecoverSSMRecords, kda_recoverssm_verify


@triton.heuristics({"HAS_EAGER": lambda args: args["eager_ptr"] is not None})
@triton.jit
def _defer_commit_kernel(state_indices_ptr, commit_lens_ptr, record_rows_ptr, pending_ptr, eager_ptr,
                         null_block_id, stride_state_indices, HAS_EAGER: tl.constexpr):
    b = tl.program_id(0)
    slot = tl.load(state_indices_ptr + b * stride_state_indices)
    row = tl.load(record_rows_ptr + b)
    live = (slot > null_block_id) & (row >= 0)
    deferred = live
    if HAS_EAGER:
        deferred = live & (tl.load(eager_ptr + b, mask=live, other=0) == 0)
    n = tl.load(commit_lens_ptr + b)
    tl.store(pending_ptr + row, tl.where(deferred, n, 0), mask=live)
    tl.store(commit_lens_ptr + b, 0, mask=deferred)


@triton.jit
def _prepare_flush_plan_kernel(state_indices_ptr, record_rows_ptr, pending_ptr, commit_lens_ptr,
                               final_state_indices_ptr, boundary_state_indices_ptr, boundary_recovery_lens_ptr,
                               null_block_id, stride_state_indices, SPEC_QUERY_LEN: tl.constexpr):
    b = tl.program_id(0)
    slot = tl.load(state_indices_ptr + b * stride_state_indices)
    row = tl.load(record_rows_ptr + b)
    live = (slot > null_block_id) & (row >= 0)
    count = tl.load(pending_ptr + row, mask=live, other=0)
    tl.store(commit_lens_ptr + b, tl.where(live, tl.minimum(tl.maximum(count, 0), SPEC_QUERY_LEN), 0))
    tl.store(final_state_indices_ptr + b, slot)
    tl.store(boundary_state_indices_ptr + b, null_block_id)
    tl.store(boundary_recovery_lens_ptr + b, 0)


__all__ = ["KDARecoverSSMRecords", "_defer_commit_kernel", "_prepare_flush_plan_kernel", "kda_recoverssm_verify"]
