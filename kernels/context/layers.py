"""Commit of several layers: one plan folded into every layer's checkpoint (docs/design.md §10).

Each layer keeps its own buffers (checkpoint pool, records, gate parameters); ``LayerTables``
holds their offsets from layer 0's in int64 tables built once, so that a commit reads them on
the device and needs no host work or allocation per call (it can be captured in a CUDA
graph). Designs (``kernels.launch.commit_layers_design``):

- ``one-launch``: the commit token loop (``fold_slot_tile``, the code of
  ``kernels.commit.token_loop``) over (V-tile, head, row, layer) in one launch, on 8-row
  tiles under a register cap (``kernels.launch.commit_layers_config``), where one layer's
  commit would leave SMs idle;
- ``per-layer``: ``kda_recoverssm_commit`` on each layer, each launch already streaming
  its state.

A commit context's conv compaction runs as one more V-tile column of the one launch, whose
programs also plan their own rows (``commit-context`` design ``plan-in-commit``), or in a
launch of its own between the plan's and the state commit (``conv-apart``, wherever the state
commit is ``per-layer``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.buffers import NULL_BLOCK_ID, CommitPlan, KDARecoverSSMRecords
from kernels.commit.row import planned_row, row_plan_columns, store_row_plan
from kernels.commit.token_loop import fold_slot_tile
from kernels.commit.wrapper import kda_recoverssm_commit
from kernels.context.conv_compaction import ConvTables, compact_conv_channels, compact_conv_states
from kernels.contract import check_commit_args, check_layer_buffers
from kernels.dependent_launch import dependent_launch, start_tile_head_row
from kernels.launch import Target, commit_context_design, commit_layers_config, commit_layers_design
from kernels.plan.steps import RequestPlan, plan_per_request, plan_request_rows
from kernels.triton_math import record_row

_CONV_CHUNK = 128  # conv channels a step of a one-warp program: [128, 4] windows, 16 entries a lane


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
    """The layers and, per buffer kind, an int64 ``[L]`` table of each layer's buffer as an
    offset in elements from layer 0's (on the layers' device), so that a kernel addresses
    every layer from layer 0's tensor and keeps its alignment. ``aligned``: every buffer
    starts on a 16-byte boundary (the kernels' loads are then vectorised). Build once
    (``of``); valid while the layers' tensors live."""

    layers: tuple[LayerBuffers, ...]
    state: torch.Tensor
    key_gate: torch.Tensor
    correction: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    aligned: bool

    @classmethod
    def of(cls, layers) -> "LayerTables":
        """Check that the layers share shapes, dtypes and device (``ValueError`` naming the
        layer and buffer), then build the tables."""
        layers = tuple(layers)
        check_layer_buffers(layers)
        device = layers[0].checkpoint_state.device
        kinds = [[x.checkpoint_state for x in layers], [x.records.key_gate for x in layers],
                 [x.records.correction for x in layers], [x.A_log for x in layers], [x.dt_bias for x in layers]]

        def table(tensors) -> torch.Tensor:
            first = tensors[0].data_ptr()
            return torch.tensor([(t.data_ptr() - first) // t.element_size() for t in tensors], dtype=torch.int64,
                                device=device)

        aligned = all(t.data_ptr() % 16 == 0 for tensors in kinds for t in tensors)
        return cls(layers, *(table(tensors) for tensors in kinds), aligned)

    @property
    def first(self) -> LayerBuffers:
        return self.layers[0]


@triton.jit
def _layer_buffer(first, offsets, layer, ALIGNED: tl.constexpr):
    """Layer ``layer``'s buffer: ``first`` (layer 0's) moved by its offset in ``offsets``;
    with ``ALIGNED`` known to start on 16 bytes, as ``first`` is."""
    offset = tl.load(offsets + layer)
    if ALIGNED:
        offset = tl.multiple_of(offset, 16 // (first.dtype.element_ty.primitive_bitwidth // 8))
    return first + offset


@triton.jit
def _fold_layer_row(states, key_gates, corrections, A_logs, dt_biases, lower_bound, n, source, rec, folds, final,
                    has_final, boundary, has_boundary, recovery, pid_v, h, layer, H: tl.constexpr, K: tl.constexpr,
                    V: tl.constexpr, T: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                    HAS_LOWER_BOUND: tl.constexpr, ALIGNED: tl.constexpr):
    """The commit token loop's program (``fold_slot_tile``) of V-tile ``pid_v``, head ``h``
    and a row planned as ``planned_row`` gives it, on layer ``layer``'s buffers, its offsets
    read once the row is known to fold; an align row's boundary tile is stored by the token
    that reaches it (fewer registers a program than holding it to the end)."""
    if folds:
        fold_slot_tile(_layer_buffer(*states, layer, ALIGNED), _layer_buffer(*key_gates, layer, ALIGNED),
                       _layer_buffer(*corrections, layer, ALIGNED), _layer_buffer(*A_logs, layer, False),
                       _layer_buffer(*dt_biases, layer, ALIGNED), lower_bound, pid_v, h, rec, n, n, source, final,
                       has_final, boundary, has_boundary, recovery, H, K, V, T, BK, BV, HAS_LOWER_BOUND, True)


@triton.jit
def _commit_layers_token_loop_kernel(
    states, key_gates, corrections, A_logs, dt_biases, lower_bound, state_indices_ptr, record_indices_ptr, plan, batch,
    stride_state_indices, null_slot, conv, conv_channels, conv_dim, conv_history, num_accepted_ptr,
    query_start_loc_ptr, request_indices_ptr, block_table_ptr, num_computed_ptr, stride_block_table,
    block_table_width, block_size,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HAS_LOWER_BOUND: tl.constexpr, HAS_RECORD_INDICES: tl.constexpr, ALIGNED: tl.constexpr, HAS_CONV: tl.constexpr,
    CONV_BLOCK: tl.constexpr, CONV_HISTORY: tl.constexpr, CONV_CHUNKS: tl.constexpr, PLAN_IN_LAUNCH: tl.constexpr,
    ALIGN: tl.constexpr, HAS_REQUEST_INDICES: tl.constexpr, DEPENDENT: tl.constexpr,
):
    """Per (V-tile, head, layer x row): ``_fold_layer_row``. Each of ``states`` ...
    ``dt_biases`` is a pair (layer 0's tensor, ``LayerTables`` offsets); program axis 2 is
    ``l * batch + b``. With ``HAS_CONV`` one more V-tile column compacts the conv states:
    its program of head ``h`` copies channels ``h * conv_channels`` on
    (``compact_conv_channels``; ``conv``: the ``ConvTables`` tensors, layer 0's first).

    A row's plan is read from ``plan`` and its record row from ``record_indices``; with
    ``PLAN_IN_LAUNCH`` every program plans its row instead (``plan_request_rows`` of
    ``num_accepted`` ... ``block_size``, ``ALIGN`` and ``HAS_REQUEST_INDICES`` as the plan
    kernel takes them), folds the records of its source slot, and program (0, 0) of layer 0
    stores the row's plan columns and its slot to ``record_indices``, as the plan kernel
    would have."""
    pid_v, h, pid_lb = start_tile_head_row(DEPENDENT)
    layer = pid_lb // batch
    b = pid_lb % batch
    if PLAN_IN_LAUNCH:
        source, commit_len, final, boundary, recovery = plan_request_rows(
            b, b >= 0, num_accepted_ptr, query_start_loc_ptr, state_indices_ptr, block_table_ptr, num_computed_ptr,
            request_indices_ptr, stride_state_indices, stride_block_table, block_table_width, block_size, null_slot,
            T, ALIGN, HAS_REQUEST_INDICES)
        if (pid_v == 0) & (h == 0) & (layer == 0):
            store_row_plan(plan, b, commit_len, final, boundary, recovery)
            tl.store(record_indices_ptr + b, source)
        rec = source.to(tl.int64)
    else:
        source, commit_len, final, boundary, recovery = row_plan_columns(plan, state_indices_ptr, b,
                                                                         stride_state_indices)
        rec = record_row(record_indices_ptr, b, HAS_RECORD_INDICES)
    if HAS_CONV:
        if pid_v == tl.cdiv(V, BV):
            first_channel = h * conv_channels
            compact_conv_channels(*conv, source, commit_len, final, boundary, recovery, layer, first_channel,
                                  tl.minimum(first_channel + conv_channels, conv_dim), conv_history, null_slot,
                                  CONV_BLOCK, CONV_HISTORY, CONV_CHUNKS)
        else:
            _fold_layer_row(states, key_gates, corrections, A_logs, dt_biases, lower_bound,
                            *planned_row(commit_len, source, rec, final, boundary, recovery, null_slot, T), pid_v, h,
                            layer, H, K, V, T, BK, BV, HAS_LOWER_BOUND, ALIGNED)
    else:
        _fold_layer_row(states, key_gates, corrections, A_logs, dt_biases, lower_bound,
                        *planned_row(commit_len, source, rec, final, boundary, recovery, null_slot, T), pid_v, h,
                        layer, H, K, V, T, BK, BV, HAS_LOWER_BOUND, ALIGNED)


def kda_recoverssm_commit_layers(tables: LayerTables, lower_bound, state_indices, plan: CommitPlan,
                                 record_indices=None) -> None:
    """``kda_recoverssm_commit`` of every layer of ``tables`` with one plan, one
    ``lower_bound`` and the same ``state_indices`` / ``record_indices`` (int32 ``[B]``):
    rows fold ``plan.commit_lens[b]`` records of their record row into each layer's final
    (and boundary) slot."""
    commit_layers_and_conv(tables, None, lower_bound, state_indices, plan, record_indices)


def commit_layers_and_conv(tables: LayerTables, conv: ConvTables | None, lower_bound, state_indices, plan: CommitPlan,
                           record_indices=None, requests: RequestPlan | None = None) -> None:
    """``kda_recoverssm_commit_layers``, and with ``conv`` the conv compaction of the same rows
    (``compact_conv_states``): inside the one launch where ``commit-context`` is
    ``plan-in-commit``, else a launch ahead of the commit.

    With ``requests``, ``plan`` and ``record_indices`` are filled first from the requests'
    plan inputs, as ``plan_per_request`` fills them (each row's slot to ``record_indices``):
    inside the one launch where ``commit-context`` is ``plan-in-commit``, else in a launch of
    its own."""
    first = tables.first
    B, H, K, V = check_commit_args(first.checkpoint_state, first.records, first.A_log, first.dt_bias, state_indices,
                                   plan, record_indices)
    if B == 0:
        return
    T = first.records.spec_query_len
    target = Target.of(first.checkpoint_state.device)
    design = commit_layers_design(B, H, V, T, target, conv=conv is not None)
    context_design = "conv-apart" if design == "per-layer" else commit_context_design()
    plan_in_launch = requests is not None and context_design == "plan-in-commit"
    if requests is not None and not plan_in_launch:
        plan_per_request(plan, requests.num_accepted, requests.query_start_loc, state_indices, T,
                         requests.request_indices, record_indices, requests.block_table, requests.num_computed,
                         requests.block_size)
    with_conv = conv is not None and context_design == "plan-in-commit"
    if conv is not None and not with_conv:
        compact_conv_states(conv, state_indices, plan)
    if design == "per-layer":
        for layer in tables.layers:
            kda_recoverssm_commit(layer.checkpoint_state, layer.records, layer.A_log, layer.dt_bias, lower_bound,
                                  state_indices, plan, record_indices)
        return
    L = len(tables.layers)
    cfg = commit_layers_config(B * L, H, K, V, T, target)
    plan_rows = (plan.commit_lens, plan.final_state_indices, plan.boundary_state_indices, plan.boundary_recovery_lens)
    conv_args, conv_options = _conv_column(conv if with_conv else None, H)
    request_args, request_options = _request_plan_args(requests if plan_in_launch else None)
    _commit_layers_token_loop_kernel[(triton.cdiv(V, cfg.block_v) + with_conv, H, L * B)](
        (first.checkpoint_state, tables.state), (first.records.key_gate, tables.key_gate),
        (first.records.correction, tables.correction), (first.A_log, tables.A_log), (first.dt_bias, tables.dt_bias),
        0.0 if lower_bound is None else float(lower_bound), state_indices, record_indices, plan_rows, B,
        state_indices.stride(0), NULL_BLOCK_ID, *conv_args, *request_args, H=H, K=K, V=V, T=T, BK=cfg.block_k,
        BV=cfg.block_v, HAS_LOWER_BOUND=lower_bound is not None, HAS_RECORD_INDICES=record_indices is not None,
        ALIGNED=tables.aligned, **conv_options, **request_options, **dependent_launch(first.checkpoint_state.device),
        num_warps=cfg.num_warps, num_stages=1, maxnreg=cfg.max_registers,
    )


def _request_plan_args(requests: RequestPlan | None) -> tuple[tuple, dict]:
    """The plan inputs' run-time arguments (``num_accepted`` ... ``block_size``) and constants
    for ``_commit_layers_token_loop_kernel``; without ``requests``, the plan is read."""
    if requests is None:
        return (None,) * 5 + (0, 0, 1), dict(PLAN_IN_LAUNCH=False, ALIGN=False, HAS_REQUEST_INDICES=False)
    align = requests.block_table is not None
    table = requests.block_table
    return ((requests.num_accepted, requests.query_start_loc, requests.request_indices, table, requests.num_computed,
             table.stride(0) if align else 0, table.shape[1] if align else 0, requests.block_size if align else 1),
            dict(PLAN_IN_LAUNCH=True, ALIGN=align, HAS_REQUEST_INDICES=requests.request_indices is not None))


def _conv_column(conv: ConvTables | None, H: int) -> tuple[tuple, dict]:
    """The conv column's run-time arguments (``conv``, ``conv_channels``, ``conv_dim``,
    ``conv_history``) and constants for ``_commit_layers_token_loop_kernel``: each of its
    ``H`` programs a row and layer copies ``dim / H`` channels, ``_CONV_CHUNK`` at a time.
    Without ``conv``, no column."""
    if conv is None:
        return (None, 0, 0, 0), dict(HAS_CONV=False, CONV_BLOCK=1, CONV_HISTORY=1, CONV_CHUNKS=1)
    channels = triton.cdiv(conv.dim, H)
    block = min(_CONV_CHUNK, triton.next_power_of_2(channels))
    tables = (conv.states[0], conv.address, conv.slot_stride, conv.dim_stride, conv.token_stride)
    return (tables, channels, conv.dim, conv.history), dict(
        HAS_CONV=True, CONV_BLOCK=block, CONV_HISTORY=triton.next_power_of_2(conv.history),
        CONV_CHUNKS=triton.cdiv(channels, block))
