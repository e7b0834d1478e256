"""Commit plans: the stock plan, deferral into pending counts, and the flush plan (docs: 6, 7).
The deferred step's plan and deferral also run as one launch (``kda_recoverssm_plan_deferred``).

Each step is a small integer kernel, ``_PLAN_BLOCK`` rows a program, writing into a
``CommitPlan`` allocated once; none allocates or synchronises, so a whole decode step can
be captured in a CUDA graph. The raw kernels ``defer_commit_kernel`` and
``prepare_flush_plan_kernel`` (one program per batch row, launched by engines themselves, whose
modules export them as the documented ``_defer_commit_kernel`` and ``_prepare_flush_plan_kernel``,
docs/implementations.md) share their row logic with the blocked kernels the wrappers launch
(``defer_batch_rows``, ``plan_flush_rows``). The flush plan kernel reads ``pending`` and never
writes it; kda's own flush (``kernels.commit.flush``) consumes the counts it folds unless asked
not to (``prepare_flush_plan``'s ``consume``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.buffers import NULL_BLOCK_ID, CommitPlan
from kernels.contract import check_pending_args, check_plan_args
from kernels.dependent_launch import await_prior_grid, dependent_launch, release_next_grid
from kernels.plan.flush_row import store_flush_plan

_PLAN_BLOCK = 128


@triton.heuristics({"HAS_EAGER": lambda args: args["eager_ptr"] is not None,
                    "HAS_REQUEST_INDICES": lambda args: args["request_indices_ptr"] is not None,
                    "WRITES_SLOT_ROWS": lambda args: args["slot_rows_ptr"] is not None})
@triton.jit
def _commit_plan_kernel(
    num_accepted_ptr, query_start_loc_ptr, state_indices_ptr, block_table_ptr, num_computed_ptr,
    commit_lens_ptr, final_state_indices_ptr, boundary_state_indices_ptr, boundary_recovery_lens_ptr,
    record_rows_ptr, pending_ptr, eager_ptr, request_indices_ptr, slot_rows_ptr,
    batch, stride_state_indices, stride_block_table, block_table_width, block_size, null_block_id,
    SPEC_QUERY_LEN: tl.constexpr, BLOCK: tl.constexpr, ALIGN: tl.constexpr, DEFER: tl.constexpr,
    HAS_EAGER: tl.constexpr, HAS_REQUEST_INDICES: tl.constexpr, WRITES_SLOT_ROWS: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    """``BLOCK`` rows a program: the stock plan (docs/design.md §6); with ``DEFER``, then
    ``defer_rows`` on it, as ``defer_commit_kernel`` would after it. With
    ``HAS_REQUEST_INDICES``, a row's accepted count, ``num_computed`` and block-table row are
    those of request ``request_indices[b]``; with ``WRITES_SLOT_ROWS``, each row's slot is
    also stored to ``slot_rows[b]`` (records kept per slot, docs/design.md §10)."""
    await_prior_grid(DEPENDENT)
    release_next_grid(DEPENDENT)
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_batch = rows < batch
    slot, lens, final, boundary, recovery = plan_request_rows(
        rows, in_batch, num_accepted_ptr, query_start_loc_ptr, state_indices_ptr, block_table_ptr, num_computed_ptr,
        request_indices_ptr, stride_state_indices, stride_block_table, block_table_width, block_size, null_block_id,
        SPEC_QUERY_LEN, ALIGN, HAS_REQUEST_INDICES)
    if DEFER:
        lens = tl.where(defer_rows(rows, in_batch, slot, lens, record_rows_ptr, pending_ptr, eager_ptr, null_block_id,
                                   HAS_EAGER), 0, lens)
    tl.store(commit_lens_ptr + rows, lens, mask=in_batch)
    tl.store(final_state_indices_ptr + rows, final, mask=in_batch)
    tl.store(boundary_state_indices_ptr + rows, boundary, mask=in_batch)
    tl.store(boundary_recovery_lens_ptr + rows, recovery, mask=in_batch)
    if WRITES_SLOT_ROWS:
        tl.store(slot_rows_ptr + rows, slot, mask=in_batch)


@triton.jit
def plan_request_rows(rows, in_batch, num_accepted_ptr, query_start_loc_ptr, state_indices_ptr, block_table_ptr,
                      num_computed_ptr, request_indices_ptr, stride_state_indices, stride_block_table,
                      block_table_width, block_size, null_block_id, SPEC_QUERY_LEN: tl.constexpr, ALIGN: tl.constexpr,
                      HAS_REQUEST_INDICES: tl.constexpr):
    """The stock plan (docs/design.md §6) of batch rows ``rows`` (a scalar or a vector, where
    ``in_batch``): ``(slot, commit_lens, final, boundary, recovery)``, int32, as the plan
    columns hold them. With ``HAS_REQUEST_INDICES``, a row's accepted count, ``num_computed``
    and block-table row are those of request ``request_indices[b]``."""
    if HAS_REQUEST_INDICES:
        requests = tl.load(request_indices_ptr + rows, mask=in_batch, other=0)
    else:
        requests = rows
    accepted = tl.load(num_accepted_ptr + requests, mask=in_batch, other=0)
    query_len = tl.load(query_start_loc_ptr + rows + 1, mask=in_batch, other=0) - tl.load(
        query_start_loc_ptr + rows, mask=in_batch, other=0)
    n = tl.minimum(tl.minimum(tl.maximum(accepted, 0), tl.maximum(query_len, 0)), SPEC_QUERY_LEN)
    slot = tl.load(state_indices_ptr + rows * stride_state_indices, mask=in_batch, other=null_block_id)
    valid = (slot > null_block_id) & (n > 0)
    if ALIGN:  # 64-bit column arithmetic: num_computed + T may pass the top of int32
        computed = tl.load(num_computed_ptr + requests, mask=in_batch, other=0).to(tl.int64)
        c_end = computed + n
        final_col = tl.minimum(tl.maximum(c_end - 1, 0) // block_size, block_table_width - 1)
        table_row = block_table_ptr + requests.to(tl.int64) * stride_block_table
        final = tl.load(table_row + final_col, mask=in_batch & valid, other=null_block_id)
        next_boundary = (computed // block_size + 1) * block_size
        boundary_col = next_boundary // block_size - 1
        has_boundary = valid & (c_end >= next_boundary) & (boundary_col < block_table_width)
        boundary = tl.load(table_row + boundary_col, mask=in_batch & has_boundary, other=null_block_id)
        recovery = tl.where(has_boundary, next_boundary - computed, 0).to(tl.int32)
    else:
        final = slot
        boundary = slot * 0 + null_block_id
        recovery = slot * 0
    return slot, tl.where(valid, n, 0), tl.where(valid, final, null_block_id), boundary, recovery


@triton.jit
def defer_rows(rows, in_batch, slot, commit_lens, record_rows_ptr, pending_ptr, eager_ptr, null_block_id,
               HAS_EAGER: tl.constexpr):
    """Defer the planned ``commit_lens`` of batch rows ``rows`` (docs/design.md §7): rows with a
    real ``slot`` and a record row move them into ``pending`` (or clear it where ``eager``).
    Returns where they moved: those rows now commit nothing."""
    row = tl.load(record_rows_ptr + rows, mask=in_batch, other=-1)
    live = in_batch & (slot > null_block_id) & (row >= 0)
    if HAS_EAGER:
        eager = tl.load(eager_ptr + rows, mask=live, other=0) != 0
    else:
        eager = rows < 0
    deferred = live & (eager == 0)
    tl.store(pending_ptr + row, tl.where(deferred, commit_lens, 0), mask=live)
    return deferred


@triton.jit
def defer_batch_rows(rows, in_batch, state_indices_ptr, commit_lens_ptr, record_rows_ptr, pending_ptr, eager_ptr,
                     null_block_id, stride_state_indices, HAS_EAGER: tl.constexpr):
    """Defer the planned commit lengths of batch rows ``rows`` (a scalar or a vector, where
    ``in_batch``) in place: ``defer_rows``, then zero the rows that moved."""
    slot = tl.load(state_indices_ptr + rows * stride_state_indices, mask=in_batch, other=null_block_id)
    lens = tl.load(commit_lens_ptr + rows, mask=in_batch, other=0)
    deferred = defer_rows(rows, in_batch, slot, lens, record_rows_ptr, pending_ptr, eager_ptr, null_block_id,
                          HAS_EAGER)
    tl.store(commit_lens_ptr + rows, lens * 0, mask=deferred)


@triton.jit
def plan_flush_rows(rows, in_batch, state_indices_ptr, record_rows_ptr, pending_ptr, commit_lens_ptr,
                    final_state_indices_ptr, boundary_state_indices_ptr, boundary_recovery_lens_ptr, null_block_id,
                    stride_state_indices, SPEC_QUERY_LEN: tl.constexpr, CONSUME: tl.constexpr):
    """Plan batch rows ``rows`` (a scalar or a vector, where ``in_batch``) to fold their
    pending counts in place (docs/design.md §7); with ``CONSUME``, zero the counts read."""
    slot = tl.load(state_indices_ptr + rows * stride_state_indices, mask=in_batch, other=null_block_id)
    row = tl.load(record_rows_ptr + rows, mask=in_batch, other=-1)
    live = in_batch & (slot > null_block_id) & (row >= 0)
    count = tl.load(pending_ptr + row, mask=live, other=0)
    if CONSUME:
        tl.store(pending_ptr + row, count * 0, mask=live)
    store_flush_plan(rows, in_batch, slot, count, commit_lens_ptr, final_state_indices_ptr,
                     boundary_state_indices_ptr, boundary_recovery_lens_ptr, null_block_id, SPEC_QUERY_LEN)


@triton.heuristics({"HAS_EAGER": lambda args: args["eager_ptr"] is not None})
@triton.jit
def defer_commit_kernel(state_indices_ptr, commit_lens_ptr, record_rows_ptr, pending_ptr, eager_ptr,
                         null_block_id, stride_state_indices, HAS_EAGER: tl.constexpr):
    """The documented defer kernel: grid ``(B,)``, one program per batch row. ``state_indices``
    int32 with row stride ``stride_state_indices``; ``commit_lens``, ``record_rows`` int32 [B];
    ``pending`` int32 [R]; ``eager`` bool/int [B] or None."""
    b = tl.program_id(0)
    defer_batch_rows(b, b >= 0, state_indices_ptr, commit_lens_ptr, record_rows_ptr, pending_ptr, eager_ptr,
                     null_block_id, stride_state_indices, HAS_EAGER)


@triton.heuristics({"HAS_EAGER": lambda args: args["eager_ptr"] is not None})
@triton.jit
def _defer_commit_blocked_kernel(state_indices_ptr, commit_lens_ptr, record_rows_ptr, pending_ptr, eager_ptr,
                                 batch, null_block_id, stride_state_indices, HAS_EAGER: tl.constexpr,
                                 BLOCK: tl.constexpr, DEPENDENT: tl.constexpr):
    """``defer_commit_kernel`` over ``BLOCK`` rows a program, grid ``(cdiv(batch, BLOCK),)``."""
    await_prior_grid(DEPENDENT)
    release_next_grid(DEPENDENT)
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    defer_batch_rows(rows, rows < batch, state_indices_ptr, commit_lens_ptr, record_rows_ptr, pending_ptr, eager_ptr,
                     null_block_id, stride_state_indices, HAS_EAGER)


@triton.jit
def prepare_flush_plan_kernel(state_indices_ptr, record_rows_ptr, pending_ptr, commit_lens_ptr,
                               final_state_indices_ptr, boundary_state_indices_ptr, boundary_recovery_lens_ptr,
                               null_block_id, stride_state_indices, SPEC_QUERY_LEN: tl.constexpr):
    """The documented flush plan kernel: grid ``(B,)``, one program per batch row; writes the
    four int32 [B] plan columns from the ``pending`` counts (int32 [R]), which it only reads."""
    b = tl.program_id(0)
    plan_flush_rows(b, b >= 0, state_indices_ptr, record_rows_ptr, pending_ptr, commit_lens_ptr,
                    final_state_indices_ptr, boundary_state_indices_ptr, boundary_recovery_lens_ptr, null_block_id,
                    stride_state_indices, SPEC_QUERY_LEN, False)


@triton.jit
def _prepare_flush_plan_blocked_kernel(state_indices_ptr, record_rows_ptr, pending_ptr, commit_lens_ptr,
                                       final_state_indices_ptr, boundary_state_indices_ptr,
                                       boundary_recovery_lens_ptr, batch, null_block_id, stride_state_indices,
                                       SPEC_QUERY_LEN: tl.constexpr, CONSUME: tl.constexpr, BLOCK: tl.constexpr,
                                       DEPENDENT: tl.constexpr):
    """``prepare_flush_plan_kernel`` over ``BLOCK`` rows a program, grid ``(cdiv(batch, BLOCK),)``;
    with ``CONSUME`` it zeroes the counts it plans."""
    await_prior_grid(DEPENDENT)
    release_next_grid(DEPENDENT)
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    plan_flush_rows(rows, rows < batch, state_indices_ptr, record_rows_ptr, pending_ptr, commit_lens_ptr,
                    final_state_indices_ptr, boundary_state_indices_ptr, boundary_recovery_lens_ptr, null_block_id,
                    stride_state_indices, SPEC_QUERY_LEN, CONSUME)


def kda_recoverssm_plan(plan: CommitPlan, num_accepted, query_start_loc, state_indices, spec_query_len,
                        block_table=None, num_computed=None, block_size=None) -> CommitPlan:
    """Fill the first B rows of ``plan`` for a stock commit; return that view.

    Align mode (``block_table [B, width]``, ``num_computed [B]``, ``block_size >= T``) sends
    the fold to the block of the last committed token and the state at the next block
    boundary to that block.
    """
    B = check_plan_args(plan, num_accepted, query_start_loc, state_indices, spec_query_len,
                        block_table, num_computed, block_size)
    return _launch_plan(plan, B, num_accepted, query_start_loc, state_indices, spec_query_len, block_table,
                        num_computed, block_size)


def kda_recoverssm_plan_deferred(plan: CommitPlan, num_accepted, query_start_loc, state_indices, spec_query_len,
                                 record_rows, pending, eager=None, block_table=None, num_computed=None,
                                 block_size=None) -> CommitPlan:
    """``kda_recoverssm_plan`` then ``kda_recoverssm_defer(plan, state_indices, record_rows,
    pending, eager)`` in one launch: the same plan rows and pending counts. Returns the plan's
    first B rows."""
    B = check_plan_args(plan, num_accepted, query_start_loc, state_indices, spec_query_len,
                        block_table, num_computed, block_size)
    check_pending_args(state_indices, record_rows, pending, plan, eager)
    return _launch_plan(plan, B, num_accepted, query_start_loc, state_indices, spec_query_len, block_table,
                        num_computed, block_size, defer=(record_rows, pending, eager))


@dataclass(frozen=True)
class RequestPlan:
    """A commit context's plan inputs, as ``plan_per_request`` takes them: int32
    ``num_accepted`` per request, ``query_start_loc [B+1]``, ``request_indices [B]`` (or None:
    request ``b``), and in align mode ``block_table [requests, width]``, ``num_computed`` per
    request and ``block_size`` (else all None)."""

    num_accepted: torch.Tensor
    query_start_loc: torch.Tensor
    request_indices: torch.Tensor | None
    block_table: torch.Tensor | None
    num_computed: torch.Tensor | None
    block_size: int | None


def plan_per_request(plan: CommitPlan, num_accepted, query_start_loc, state_indices, spec_query_len,
                     request_indices, slot_rows, block_table=None, num_computed=None, block_size=None) -> CommitPlan:
    """``kda_recoverssm_plan`` where ``num_accepted``, ``num_computed`` and ``block_table``
    are indexed by request, row ``b`` reading request ``request_indices[b]`` (int32 ``[B]``,
    or ``None``: request ``b``), which also stores each row's slot to ``slot_rows[b]`` (int32,
    at least ``[B]``). Arguments already checked (``KDARecoverSSMCommitContext``)."""
    return _launch_plan(plan, state_indices.shape[0], num_accepted, query_start_loc, state_indices, spec_query_len,
                        block_table, num_computed, block_size, per_request=(request_indices, slot_rows))


def _launch_plan(plan: CommitPlan, B: int, num_accepted, query_start_loc, state_indices, spec_query_len,
                 block_table, num_computed, block_size, defer=(None, None, None),
                 per_request=(None, None)) -> CommitPlan:
    rows = plan.rows(B)
    if B == 0:
        return rows
    align = block_table is not None
    _commit_plan_kernel[(triton.cdiv(B, _PLAN_BLOCK),)](
        num_accepted, query_start_loc, state_indices, block_table, num_computed,
        rows.commit_lens, rows.final_state_indices, rows.boundary_state_indices, rows.boundary_recovery_lens,
        *defer, *per_request, B, state_indices.stride(0), block_table.stride(0) if align else 0,
        block_table.shape[1] if align else 0, block_size if align else 1, NULL_BLOCK_ID,
        SPEC_QUERY_LEN=spec_query_len, BLOCK=_PLAN_BLOCK, ALIGN=align, DEFER=defer[0] is not None,
        **dependent_launch(state_indices.device),
    )
    return rows


def kda_recoverssm_defer(plan: CommitPlan, state_indices, record_rows, pending, eager=None) -> None:
    """After a plan: rows with a real slot and a record row move ``commit_lens`` into
    ``pending[record_rows[b]]`` and commit nothing now, unless ``eager[b]`` is set, in which
    case the plan is kept and the pending count cleared."""
    B = check_pending_args(state_indices, record_rows, pending, plan, eager)
    if B == 0:
        return
    _defer_commit_blocked_kernel[(triton.cdiv(B, _PLAN_BLOCK),)](
        state_indices, plan.commit_lens, record_rows, pending, eager, B, NULL_BLOCK_ID, state_indices.stride(0),
        BLOCK=_PLAN_BLOCK, **dependent_launch(state_indices.device),
    )


def prepare_flush_plan(plan: CommitPlan, state_indices, record_rows, pending, spec_query_len: int,
                       consume: bool) -> None:
    """Fill ``plan`` to fold each row's pending records in place; ``consume`` zeroes the counts."""
    B = check_pending_args(state_indices, record_rows, pending, plan)
    if B == 0:
        return
    _prepare_flush_plan_blocked_kernel[(triton.cdiv(B, _PLAN_BLOCK),)](
        state_indices, record_rows, pending, plan.commit_lens, plan.final_state_indices,
        plan.boundary_state_indices, plan.boundary_recovery_lens, B, NULL_BLOCK_ID, state_indices.stride(0),
        SPEC_QUERY_LEN=spec_query_len, CONSUME=consume, BLOCK=_PLAN_BLOCK, **dependent_launch(state_indices.device),
    )
