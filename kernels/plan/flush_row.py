"""A flush's plan row (docs/design.md §7): fold a row's pending count of records into its own
slot in place, with no boundary slot. Shared by the flush plan kernel and the kernels that
plan a flush themselves, so that every flush plans its rows alike."""

import triton
import triton.language as tl


@triton.jit
def planned_flush_count(count, SPEC_QUERY_LEN: tl.constexpr):
    """A pending count as a flush plans it: clamped to ``[0, SPEC_QUERY_LEN]``."""
    return tl.minimum(tl.maximum(count, 0), SPEC_QUERY_LEN)


@triton.jit
def store_flush_plan(rows, mask, slot, count, commit_lens_ptr, final_state_indices_ptr, boundary_state_indices_ptr,
                     boundary_recovery_lens_ptr, null_block_id, SPEC_QUERY_LEN: tl.constexpr):
    """Plan rows ``rows`` (where ``mask``; a scalar or a vector, like ``slot`` and ``count``)
    to fold ``count`` pending records into ``slot`` in place, with no boundary slot. Returns
    the count as planned (``planned_flush_count``)."""
    count = planned_flush_count(count, SPEC_QUERY_LEN)
    tl.store(commit_lens_ptr + rows, count, mask=mask)
    tl.store(final_state_indices_ptr + rows, slot, mask=mask)
    tl.store(boundary_state_indices_ptr + rows, null_block_id, mask=mask)
    tl.store(boundary_recovery_lens_ptr + rows, 0, mask=mask)
    return count
