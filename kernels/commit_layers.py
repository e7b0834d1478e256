"""Commit of several layers: one plan folded into every layer's checkpoint (docs/design.md §10).

Each layer keeps its own buffers (checkpoint pool, records, gate parameters); ``LayerTables``
holds their addresses in int64 tables built once, so that a commit reads them on the device
and needs no host work or allocation per call (it can be captured in a CUDA graph). Two
designs (``kernels.launch.commit_layers_design``):

- ``one-launch``: the commit token loop (``fold_slot_tile``, the code of
  ``kernels.commit_token_loop``) over (V-tile, head, row, layer) in one launch, on 8-row
  tiles under a register cap (``kernels.launch.commit_layers_config``), where one layer's
  commit would leave SMs idle;
- ``per-layer``: ``kda_recoverssm_commit`` on each layer, each launch already streaming
  its state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.buffers import NULL_BLOCK_ID, CommitPlan, KDARecoverSSMRecords
from kernels.commit import kda_recoverssm_commit
from kernels.commit_row import commit_row
from kernels.commit_token_loop import fold_slot_tile
from kernels.contract import check_commit_args, check_layer_buffers
from kernels.dependent_launch import dependent_launch, start_tile_head_row
from kernels.launch import Target, commit_layers_config, commit_layers_design


@dataclass(frozen=True)
class LayerBuffers:
    """One layer's commit buffers: checkpoint ``[N, H, V, K]``, records, ``A_log [H]``,
    ``dt_bias [H*K]``."""

    checkpoint_state: torch.Tensor
    records: KDARecoverSSMRecords
    A_log: torch.Tensor
    dt_bias: torch.Tensor


@dataclass(frozen=True)
class LayerTables:
    """The layers and, per buffer kind, an int64 ``[L]`` table of each layer's ``data_ptr``
    (on the layers' device). Build once (``of``); valid while the layers' tensors live."""

    layers: tuple[LayerBuffers, ...]
    state: torch.Tensor
    key_gate: torch.Tensor
    correction: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor

    @classmethod
    def of(cls, layers) -> "LayerTables":
        """Check that the layers share shapes, dtypes and device (``ValueError`` naming the
        layer and buffer), then build the tables."""
        layers = tuple(layers)
        check_layer_buffers(layers)
        device = layers[0].checkpoint_state.device

        def table(tensors) -> torch.Tensor:
            return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device=device)

        return cls(layers, table(x.checkpoint_state for x in layers), table(x.records.key_gate for x in layers),
                   table(x.records.correction for x in layers), table(x.A_log for x in layers),
                   table(x.dt_bias for x in layers))

    @property
    def first(self) -> LayerBuffers:
        return self.layers[0]


@triton.jit
def _layer_buffers(state_ref, key_gate_ref, state_table, key_gate_table, correction_table, A_log_table, dt_bias_table,
                   layer):
    """Layer ``layer``'s buffers from the tables: ``(state, key_gate, correction, A_log,
    dt_bias)`` pointers, typed as ``state_ref``'s and ``key_gate_ref``'s elements and float32."""
    return (tl.load(state_table + layer).to(tl.pointer_type(state_ref.dtype.element_ty)),
            tl.load(key_gate_table + layer).to(tl.pointer_type(key_gate_ref.dtype.element_ty)),
            tl.load(correction_table + layer).to(tl.pointer_type(tl.float32)),
            tl.load(A_log_table + layer).to(tl.pointer_type(tl.float32)),
            tl.load(dt_bias_table + layer).to(tl.pointer_type(tl.float32)))


@triton.jit
def _commit_layers_token_loop_kernel(
    state_ref, key_gate_ref, state_table, key_gate_table, correction_table, A_log_table, dt_bias_table, lower_bound,
    state_indices_ptr, record_indices_ptr, plan, batch, stride_state_indices, null_slot,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HAS_LOWER_BOUND: tl.constexpr, HAS_RECORD_INDICES: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    """Per (V-tile, head, layer x row): the commit token loop's program (``fold_slot_tile``)
    on layer ``l``'s buffers, whose addresses it reads from the tables; ``state_ref`` and
    ``key_gate_ref`` (layer 0's) give the element types. Program axis 2 is ``l * batch + b``.
    The tables are read once the row is known to fold; an align row's boundary tile is stored
    by the token that reaches it (fewer registers a program than holding it to the end)."""
    pid_v, h, pid_lb = start_tile_head_row(DEPENDENT)
    layer = pid_lb // batch
    b = pid_lb % batch
    tables = (state_ref, key_gate_ref, state_table, key_gate_table, correction_table, A_log_table, dt_bias_table)
    n, source, rec, folds, final, has_final, boundary, has_boundary, recovery = commit_row(
        plan, state_indices_ptr, record_indices_ptr, b, stride_state_indices, null_slot, T, HAS_RECORD_INDICES)
    if folds:
        state_ptr, key_gate_ptr, correction_ptr, A_log_ptr, dt_bias_ptr = _layer_buffers(*tables, layer)
        fold_slot_tile(state_ptr, key_gate_ptr, correction_ptr, A_log_ptr, dt_bias_ptr, lower_bound, pid_v, h, rec, n,
                       n, source, final, has_final, boundary, has_boundary, recovery, H, K, V, T, BK, BV,
                       HAS_LOWER_BOUND, True)


def kda_recoverssm_commit_layers(tables: LayerTables, lower_bound, state_indices, plan: CommitPlan,
                                 record_indices=None) -> None:
    """``kda_recoverssm_commit`` of every layer of ``tables`` with one plan, one
    ``lower_bound`` and the same ``state_indices`` / ``record_indices`` (int32 ``[B]``):
    rows fold ``plan.commit_lens[b]`` records of their record row into each layer's final
    (and boundary) slot."""
    first = tables.first
    B, H, K, V = check_commit_args(first.checkpoint_state, first.records, first.A_log, first.dt_bias, state_indices,
                                   plan, record_indices)
    if B == 0:
        return
    T = first.records.spec_query_len
    target = Target.of(first.checkpoint_state.device)
    design = commit_layers_design(B, H, V, T, target)
    if design == "per-layer":
        for layer in tables.layers:
            kda_recoverssm_commit(layer.checkpoint_state, layer.records, layer.A_log, layer.dt_bias, lower_bound,
                                  state_indices, plan, record_indices)
        return
    L = len(tables.layers)
    cfg = commit_layers_config(B * L, H, K, V, T, target)
    plan_rows = (plan.commit_lens, plan.final_state_indices, plan.boundary_state_indices, plan.boundary_recovery_lens)
    _commit_layers_token_loop_kernel[(triton.cdiv(V, cfg.block_v), H, L * B)](
        first.checkpoint_state, first.records.key_gate, tables.state, tables.key_gate, tables.correction,
        tables.A_log, tables.dt_bias, 0.0 if lower_bound is None else float(lower_bound), state_indices,
        record_indices, plan_rows, B, state_indices.stride(0), NULL_BLOCK_ID, H=H, K=K, V=V, T=T, BK=cfg.block_k,
        BV=cfg.block_v, HAS_LOWER_BOUND=lower_bound is not None, HAS_RECORD_INDICES=record_indices is not None,
        **dependent_launch(first.checkpoint_state.device),
        num_warps=cfg.num_warps, num_stages=1, maxnreg=cfg.max_registers,
    )
