"""Conv-state compaction: after a commit, each layer's short-convolution window ends at the
last accepted token (docs/design.md §10).

A slot's conv state holds, along its token axis, ``S = (W - 1) + (T - 1)`` inputs: the
``W - 1`` history inputs the window needs followed by the verify's further ``T - 1``, so
that the last ``W - 1`` inputs up to accepted token ``n`` are entries ``n - 1 .. n + W - 3``.
Compaction copies those to entries ``0 .. W - 2`` of the plan's final slot, and in align mode
the window up to the boundary (``R - 1 ..``) to the boundary slot. Layers are addressed
through int64 tables of base address and strides (``ConvTables``), so any layout of
``[N, dim, S]`` (token stride free) runs, the engine's ``[N, S, dim]`` as its transpose.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.buffers import NULL_BLOCK_ID, CommitPlan
from kernels.commit.row import row_plan_columns
from kernels.dependent_launch import await_prior_grid, dependent_launch, release_next_grid

_BLOCK_DIM = 512  # channels a program: at K3 (4608 channels) 9 programs a row and layer, each 3-6 KiB


@dataclass(frozen=True)
class ConvTables:
    """Layers' conv states as ``[N, dim, S]`` views (``states``), with int64 ``[L]`` tables of
    each one's address and its slot, channel and token strides (elements), and
    ``history = W - 1``. Build once (``of``)."""

    states: tuple[torch.Tensor, ...]
    address: torch.Tensor
    slot_stride: torch.Tensor
    dim_stride: torch.Tensor
    token_stride: torch.Tensor
    history: int

    @classmethod
    def of(cls, states, history: int) -> "ConvTables":
        """Tables of ``states`` (``[N, dim, S]`` views of one shape, dtype and device, checked
        by the caller), keeping ``history`` entries."""
        states = tuple(states)
        device = states[0].device

        def table(values) -> torch.Tensor:
            return torch.tensor(list(values), dtype=torch.int64, device=device)

        return cls(states, table(s.data_ptr() for s in states), table(s.stride(0) for s in states),
                   table(s.stride(1) for s in states), table(s.stride(2) for s in states), history)

    @property
    def dim(self) -> int:
        return self.states[0].shape[1]


@triton.jit
def compact_conv_channels(conv_ref, address_table, slot_stride_table, dim_stride_table, token_stride_table, source, n,
                          final, boundary, recovery, layer, first_channel, end_channel, history, null_slot,
                          BLOCK_DIM: tl.constexpr, BLOCK_HISTORY: tl.constexpr, CHUNKS: tl.constexpr):
    """A row's compaction on layer ``layer``, channels ``first_channel`` up to
    ``end_channel`` in ``CHUNKS`` chunks of ``BLOCK_DIM``, given its plan columns and source
    slot (``kernels.commit.row.row_plan_columns``): a row that commits (``n > 0``, real
    source and final slots) copies its source's entries ``n - 1 + j`` to the final slot's
    ``j``, and ``R - 1 + j`` to a real boundary slot's ``j``, ``j < history``. In each chunk
    every load precedes every store (the source may be either destination)."""
    source = source.to(tl.int64)
    final = final.to(tl.int64)
    if (source > null_slot) & (n > 0) & (final > null_slot):
        boundary_slot = boundary.to(tl.int64)
        has_boundary = (boundary_slot > null_slot) & (recovery > 0) & (recovery <= n)
        base = tl.load(address_table + layer).to(tl.pointer_type(conv_ref.dtype.element_ty))
        slot_stride = tl.load(slot_stride_table + layer)
        dim_stride = tl.load(dim_stride_table + layer)
        token_stride = tl.load(token_stride_table + layer)
        offs_j = tl.arange(0, BLOCK_HISTORY)
        for c in tl.static_range(CHUNKS):
            offs_d = first_channel + c * BLOCK_DIM + tl.arange(0, BLOCK_DIM)
            mask = (offs_d < end_channel)[:, None] & (offs_j < history)[None, :]
            channels = base + offs_d[:, None].to(tl.int64) * dim_stride
            source_rows = channels + source * slot_stride
            final_window = tl.load(source_rows + (n - 1 + offs_j)[None, :] * token_stride, mask=mask)
            boundary_mask = mask & has_boundary
            boundary_window = tl.load(source_rows + (recovery - 1 + offs_j)[None, :] * token_stride,
                                      mask=boundary_mask)
            tl.debug_barrier()
            tl.store(channels + boundary_slot * slot_stride + offs_j[None, :] * token_stride, boundary_window,
                     mask=boundary_mask)
            tl.store(channels + final * slot_stride + offs_j[None, :] * token_stride, final_window, mask=mask)


@triton.jit
def _compact_conv_states_kernel(
    conv_ref, address_table, slot_stride_table, dim_stride_table, token_stride_table, state_indices_ptr, plan,
    stride_state_indices, dim, history, null_slot, BLOCK_DIM: tl.constexpr, BLOCK_HISTORY: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    """Per (block of channels, row, layer): ``compact_conv_channels`` of the block."""
    await_prior_grid(DEPENDENT)
    release_next_grid(DEPENDENT)
    pid_d = tl.program_id(0)
    source, n, final, boundary, recovery = row_plan_columns(plan, state_indices_ptr, tl.program_id(1),
                                                            stride_state_indices)
    compact_conv_channels(conv_ref, address_table, slot_stride_table, dim_stride_table, token_stride_table, source, n,
                          final, boundary, recovery, tl.program_id(2), pid_d * BLOCK_DIM, dim, history, null_slot,
                          BLOCK_DIM, BLOCK_HISTORY, 1)


def compact_conv_states(tables: ConvTables, state_indices, plan: CommitPlan) -> None:
    """Compact every layer's conv state for the first ``B`` rows of ``plan`` (``B`` =
    ``state_indices.shape[0]``; arguments already checked): one launch for all layers."""
    B = state_indices.shape[0]
    if B == 0:
        return
    plan_rows = (plan.commit_lens, plan.final_state_indices, plan.boundary_state_indices, plan.boundary_recovery_lens)
    _compact_conv_states_kernel[(triton.cdiv(tables.dim, _BLOCK_DIM), B, len(tables.states))](
        tables.states[0], tables.address, tables.slot_stride, tables.dim_stride, tables.token_stride, state_indices,
        plan_rows, state_indices.stride(0), tables.dim, tables.history, NULL_BLOCK_ID, BLOCK_DIM=_BLOCK_DIM,
        BLOCK_HISTORY=triton.next_power_of_2(tables.history), **dependent_launch(tables.states[0].device),
        num_warps=4,
    )
