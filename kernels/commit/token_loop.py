"""Commit, the token-loop design: records folded one token at a time into a state tile held
in registers.

For the fewest tokens (docs/design.md §9): one program per (V-tile, row, head) holds a whole
``[BV, K]`` state tile and folds the records one token at a time (the recurrence of
docs/design.md §2): elementwise work, no product and no operand. Its ``PENDING`` form folds
each row's pending count instead of a plan row (``kernels.commit.fold_pending``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.buffers import NULL_BLOCK_ID
from kernels.commit.fold import fold_recorded_token
from kernels.commit.row import CommitCall, commit_row
from kernels.dependent_launch import dependent_launch, start_tile_head_row
from kernels.launch import CommitConfig
from kernels.plan.flush_row import planned_flush_count
from kernels.triton_math import head_decay_rate, record_row


@triton.jit
def _commit_token_loop_kernel(
    state_ptr, records, gate, state_indices_ptr, record_indices_ptr, plan, pending_ptr, stride_state_indices, null_slot,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HAS_LOWER_BOUND: tl.constexpr, HAS_RECORD_INDICES: tl.constexpr, PENDING: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    """Per (V-tile, head, row): the whole ``[BV, BK]`` state tile in registers, folded one
    recorded token at a time (``fold_recorded_token``); the state after ``recovery`` tokens
    goes to the boundary slot, after ``n`` to the final one. Each token's work is elementwise
    over the tile but for its key's norm, and nothing is stored before the last token, so
    every token's loads can go out at once.

    ``null_slot`` is ``NULL_SLOT`` passed at run time: as a constant, the compiler folds the
    row's checks together and ptxas schedules the tile's loads later, which measured slower at
    T=4 (``docs/experiments.md`` §1).

    With ``PENDING`` the plan is not read: each row folds its pending count (``pending``
    at its record row, as a flush plans it) into its own slot in place, and neither consumes
    the count nor writes a plan row (``fold_pending``)."""
    key_gate_ptr, correction_ptr = records
    A_log_ptr, dt_bias_ptr, lower_bound = gate
    pid_v, h, b = start_tile_head_row(DEPENDENT)
    if PENDING:
        source = tl.load(state_indices_ptr + b * stride_state_indices).to(tl.int64)
        rec = record_row(record_indices_ptr, b, HAS_RECORD_INDICES)
        owned = (source > null_slot) & (rec >= 0)
        n = planned_flush_count(tl.load(pending_ptr + rec, mask=owned, other=0), T)
        # every record of an owned row is read whatever its count, so no load waits for it
        folds, read_count = owned, T
        final, has_final = source, n > 0
        # no boundary slot, its names bound all the same: compiled, a plain False is a tensor,
        # so the boundary branch below is still generated
        boundary, has_boundary, recovery = source, False, 0
    else:
        n, source, rec, folds, final, has_final, boundary, has_boundary, recovery = commit_row(
            plan, state_indices_ptr, record_indices_ptr, b, stride_state_indices, null_slot, T, HAS_RECORD_INDICES)
        read_count = n
    if folds:
        fold_slot_tile(state_ptr, key_gate_ptr, correction_ptr, A_log_ptr, dt_bias_ptr, lower_bound, pid_v, h, rec, n,
                       read_count, source, final, has_final, boundary, has_boundary, recovery, H, K, V, T, BK, BV,
                       HAS_LOWER_BOUND, False)


@triton.jit
def fold_slot_tile(state_ptr, key_gate_ptr, correction_ptr, A_log_ptr, dt_bias_ptr, lower_bound, pid_v, h, rec, n,
                   read_count, source, final, has_final, boundary, has_boundary, recovery, H: tl.constexpr,
                   K: tl.constexpr, V: tl.constexpr, T: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                   HAS_LOWER_BOUND: tl.constexpr, BOUNDARY_IN_LOOP: tl.constexpr):
    """One row's fold on V-tile ``pid_v`` of head ``h``: the ``[BV, BK]`` tile of slot ``source``
    folded through the first ``n`` records of record row ``rec`` (``read_count`` of them read),
    stored to ``final`` where ``has_final``, and after ``recovery`` records to ``boundary``
    where ``has_boundary``. Pointers are a layer's own buffers (``commit_row`` gives the rest).
    The boundary tile is kept beside the state and stored after the loop, or with
    ``BOUNDARY_IN_LOOP`` stored by the token that reaches it (a masked store a token, a
    tile's registers fewer)."""
    offs_v = pid_v * BV + tl.arange(0, BV)
    offs_k = tl.arange(0, BK)
    mask_vk = (offs_v < V)[:, None] & (offs_k < K)[None, :]
    tile = (h * V + offs_v[:, None]) * K + offs_k[None, :]
    S = tl.load(state_ptr + source * (H * V * K) + tile, mask=mask_vk, other=0.0).to(tl.float32)
    A_h = head_decay_rate(A_log_ptr, h)
    dt_bias = tl.load(dt_bias_ptr + h * K + offs_k, mask=offs_k < K, other=0.0)
    first = (rec * H + h) * T
    dtype = state_ptr.dtype.element_ty
    if has_boundary:
        if BOUNDARY_IN_LOOP:
            for t in tl.static_range(T):
                S = fold_recorded_token(S, key_gate_ptr, correction_ptr, first, t, t < n, t < read_count, offs_k,
                                        offs_v, dt_bias, A_h, lower_bound, K, V, HAS_LOWER_BOUND)
                tl.store(state_ptr + boundary * (H * V * K) + tile, S.to(dtype), mask=mask_vk & (recovery == t + 1))
        else:
            S_boundary = S
            for t in tl.static_range(T):
                S = fold_recorded_token(S, key_gate_ptr, correction_ptr, first, t, t < n, t < read_count, offs_k,
                                        offs_v, dt_bias, A_h, lower_bound, K, V, HAS_LOWER_BOUND)
                S_boundary = tl.where(recovery == t + 1, S, S_boundary)
            tl.store(state_ptr + boundary * (H * V * K) + tile, S_boundary.to(dtype), mask=mask_vk)
    else:
        for t in tl.static_range(T):
            S = fold_recorded_token(S, key_gate_ptr, correction_ptr, first, t, t < n, t < read_count, offs_k,
                                    offs_v, dt_bias, A_h, lower_bound, K, V, HAS_LOWER_BOUND)
    tl.store(state_ptr + final * (H * V * K) + tile, S.to(dtype),
             mask=(offs_v < V)[:, None] & (offs_k < tl.where(has_final, K, 0))[None, :])


def launch_token_loop(call: CommitCall, cfg: CommitConfig) -> None:
    """One launch of ``_commit_token_loop_kernel`` over ``call.plan_rows``, or over its
    ``pending`` counts (``PENDING``) where it has them."""
    _commit_token_loop_kernel[(triton.cdiv(call.V, cfg.block_v), call.H, call.B)](
        call.state, call.record_tensors(), call.gate(), call.state_indices, call.record_indices, call.plan_rows,
        call.pending, call.state_indices.stride(0), NULL_BLOCK_ID, V=call.V, BK=cfg.block_k, BV=cfg.block_v,
        PENDING=call.pending is not None, **call.shape_options(), **dependent_launch(call.state.device),
        num_warps=1, num_stages=1, maxnreg=cfg.max_registers,
    )
