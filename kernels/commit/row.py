"""What the commit designs share: the call's arguments, a row's plan as every kernel reads it,
and a slot's tile.

Kernels take their related pointers as tuples (``CommitCall`` builds them): ``records =
(key_gate, correction)``, ``gate = (A_log, dt_bias, lower_bound)``, ``plan`` (the
``CommitPlan``'s four row pointers in its field order; ``None`` each where a kernel reads
pending counts instead) and ``fold_operands = (fold, decay)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.buffers import KDARecoverSSMRecords
from kernels.triton_math import record_row


@dataclass(frozen=True)
class CommitCall:
    """The checked arguments of one fold of records into slots: the checkpoint ``[N, H, V, K]``,
    the records, the gate's parameters, the rows' slots and record rows, and either the plan's
    four row tensors (``plan_rows``) or per-record-row ``pending`` counts; ``B, H, K, V, T`` its
    dims."""

    state: torch.Tensor
    records: KDARecoverSSMRecords
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    lower_bound: float | None
    state_indices: torch.Tensor
    record_indices: torch.Tensor | None
    plan_rows: tuple
    pending: torch.Tensor | None
    B: int
    H: int
    K: int
    V: int
    T: int

    def gate(self) -> tuple:
        """The kernels' ``gate`` (``lower_bound`` 0 where there is none: ``HAS_LOWER_BOUND`` false)."""
        return self.A_log, self.dt_bias, 0.0 if self.lower_bound is None else float(self.lower_bound)

    def record_tensors(self) -> tuple:
        """The kernels' ``records``: ``(key_gate, correction)``."""
        return self.records.key_gate, self.records.correction

    def shape_options(self) -> dict:
        """The compile-time shape and flags every commit kernel takes."""
        return dict(H=self.H, K=self.K, T=self.T, HAS_LOWER_BOUND=self.lower_bound is not None,
                    HAS_RECORD_INDICES=self.record_indices is not None)


@triton.jit
def commit_row(plan, state_indices_ptr, record_indices_ptr, b, stride_state_indices, null_slot, T: tl.constexpr,
               HAS_RECORD_INDICES: tl.constexpr):
    """Row ``b``'s plan as every commit kernel reads it: ``planned_row`` of its plan columns
    (``row_plan_columns``). ``null_slot``: ``NULL_SLOT``, or the same value passed at run time
    (``kernels.commit.token_loop`` says why)."""
    source, commit_len, final, boundary, recovery = row_plan_columns(plan, state_indices_ptr, b, stride_state_indices)
    return planned_row(commit_len, source, record_row(record_indices_ptr, b, HAS_RECORD_INDICES), final, boundary,
                       recovery, null_slot, T)


@triton.jit
def row_plan_columns(plan, state_indices_ptr, b, stride_state_indices):
    """Row ``b``'s ``(source, commit_len, final, boundary, recovery)``, int32 as stored:
    ``plan`` is the ``CommitPlan``'s four row pointers, in its field order."""
    commit_lens_ptr, final_state_indices_ptr, boundary_state_indices_ptr, boundary_recovery_lens_ptr = plan
    return (tl.load(state_indices_ptr + b * stride_state_indices), tl.load(commit_lens_ptr + b),
            tl.load(final_state_indices_ptr + b), tl.load(boundary_state_indices_ptr + b),
            tl.load(boundary_recovery_lens_ptr + b))


@triton.jit
def store_row_plan(plan, b, commit_len, final, boundary, recovery):
    """Store row ``b``'s plan columns (the inverse of ``row_plan_columns``)."""
    commit_lens_ptr, final_state_indices_ptr, boundary_state_indices_ptr, boundary_recovery_lens_ptr = plan
    tl.store(commit_lens_ptr + b, commit_len)
    tl.store(final_state_indices_ptr + b, final)
    tl.store(boundary_state_indices_ptr + b, boundary)
    tl.store(boundary_recovery_lens_ptr + b, recovery)


@triton.jit
def planned_row(commit_len, source, rec, final, boundary, recovery, null_slot, T: tl.constexpr):
    """A row's plan columns (``commit_len``, ``final``, ``boundary``, ``recovery``), its source
    slot and record row as a commit kernel uses them: ``(n, source, record row, folds, final,
    has_final, boundary, has_boundary, recovery)``, slots int64; nothing is folded unless
    ``folds``, a slot is written only where its ``has_*`` holds."""
    n = tl.minimum(commit_len, T)
    source = source.to(tl.int64)
    final = final.to(tl.int64)
    boundary = boundary.to(tl.int64)
    has_boundary = (boundary > null_slot) & (recovery > 0) & (recovery <= n)
    folds = (n > 0) & (source > null_slot) & (rec >= 0)
    return n, source, rec, folds, final, final > null_slot, boundary, has_boundary, recovery


@triton.jit
def slot_tile(state_ptr, slot, h, offs_v, H: tl.constexpr, V: tl.constexpr, K: tl.constexpr):
    """``[BV, 1]`` pointers to rows ``offs_v`` of head ``h`` of checkpoint slot ``slot``."""
    return state_ptr + slot * (H * V * K) + (h * V + offs_v[:, None]) * K
