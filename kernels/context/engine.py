"""The engine's commit: one call per decode step folds the accepted tokens into every KDA
layer (docs/design.md §10).

``KDARecoverSSMCommitContext.create`` is called once, over the model's layers; it checks their
buffers and builds the device tables and the plan buffers. ``commit`` then launches,
allocating and synchronising nothing (a step can be captured in a CUDA graph), the plan
(accepted counts read through ``request_indices``; align mode with boundary states), the
conv-state compaction and the state commit of every layer: all three in one launch where
the state commit is one launch for all layers (the plan still stored to ``plan``), else
the plan, the compaction and a commit a layer. A layer's records are kept per state slot
(row ``b`` folds the records of its source slot) or per batch row (row ``b`` folds record row
``b``), and align mode follows kda's rule or the released vLLM engine's
(``kernels.commit_rules``); the two others run the plan in a launch of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.buffers import CommitPlan, KDARecoverSSMRecords
from kernels.commit_rules import apply_rule
from kernels.context.conv_compaction import ConvTables
from kernels.context.layers import LayerBuffers, LayerTables, commit_layers_and_conv
from kernels.contract import check_commit_context_args, check_context_layers
from kernels.plan.steps import RequestPlan, plan_per_request


@dataclass(frozen=True)
class CommitLayer:
    """What the context reads of a layer (an engine's layer object has these attributes; a
    tuple in this order is taken too): ``kv_cache = (conv_state, checkpoint_state,
    correction, key_gate)`` with ``conv_state`` ``[N, dim, S]`` (or ``[N, S, dim]``, see
    ``create``), ``checkpoint_state [N, H, V, K]``, ``correction [N, H, T, V]`` float32,
    ``key_gate [N, H, T, 2K]``; ``A_log [H]``, ``dt_bias [H*K]`` float32; ``local_num_heads``
    (H), ``head_dim`` (K) and ``gate_lower_bound`` (None: the softplus gate)."""

    kv_cache: tuple
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    local_num_heads: int
    head_dim: int
    gate_lower_bound: float | None


class KDARecoverSSMCommitContext:
    """A model's KDA layers and the buffers their commit reuses every step."""

    def __init__(self, layers: tuple[CommitLayer, ...], tables: LayerTables, conv: ConvTables, plan: CommitPlan,
                 slot_rows: torch.Tensor, spec_query_len: int, records: str = "slot", rule: str = "kda"):
        self.layers = layers
        self.records, self.rule = records, rule
        self.folds = CommitPlan.allocate(plan.max_batch, plan.commit_lens.device) if rule != "kda" else plan
        self.tables = tables
        self.conv = conv
        self.plan = plan
        self.slot_rows = slot_rows
        self.spec_query_len = spec_query_len
        self.lower_bound = layers[0].gate_lower_bound

    @classmethod
    def create(cls, layers, spec_query_len: int, max_num_reqs: int, conv_dim_first: bool = True,
               records: str = "slot", rule: str = "kda") -> "KDARecoverSSMCommitContext":
        """Check ``layers`` (``CommitLayer`` objects or tuples) and build the context for
        windows of ``spec_query_len`` tokens and batches of up to ``max_num_reqs`` rows.
        ``conv_dim_first``: conv states are ``[N, dim, S]``; false: ``[N, S, dim]``.
        ``records`` and ``rule``: ``kernels.commit_rules``'s ``RECORD_ROWS`` and
        ``COMMIT_RULES``. Every layer must match the first in shapes, dtypes and device, and
        share its lower bound; ``S - spec_query_len + 1`` history entries are kept. Raises
        ``ValueError`` naming the argument."""
        layers = tuple(layer if hasattr(layer, "kv_cache") else CommitLayer(*layer) for layer in layers)
        check_context_layers(layers, spec_query_len, max_num_reqs, conv_dim_first, records, rule)
        buffers = [LayerBuffers(layer.kv_cache[1], KDARecoverSSMRecords(layer.kv_cache[2], layer.kv_cache[3]),
                                layer.A_log, layer.dt_bias) for layer in layers]
        convs = [layer.kv_cache[0] if conv_dim_first else layer.kv_cache[0].transpose(1, 2) for layer in layers]
        device = buffers[0].checkpoint_state.device
        return cls(layers, LayerTables.of(buffers), ConvTables.of(convs, convs[0].shape[2] - spec_query_len + 1),
                   CommitPlan.allocate(max_num_reqs, device),
                   torch.zeros(max_num_reqs, dtype=torch.int32, device=device), spec_query_len, records, rule)

    @property
    def max_num_reqs(self) -> int:
        return self.plan.max_batch

    def commit(self, num_accepted_tokens, state_indices, query_start_loc, request_indices=None, block_table=None,
               num_computed_tokens=None, mamba_block_size=None) -> None:
        """Commit the step's accepted tokens into every layer. ``state_indices`` int32 ``[B]``
        (a strided column allowed), ``query_start_loc`` int32 ``[B+1]``; ``num_accepted_tokens``
        int32, per request: row ``b``'s is at ``request_indices[b]`` (int32, at least ``[B]``)
        or at ``b``. Align mode: ``block_table`` int32 ``[requests, width]``,
        ``num_computed_tokens`` int32 per request, ``mamba_block_size >= spec_query_len``, all
        three or none. Raises ``ValueError`` naming the argument before any launch."""
        B = check_commit_context_args(self, num_accepted_tokens, state_indices, query_start_loc, request_indices,
                                      block_table, num_computed_tokens, mamba_block_size)
        if B == 0:
            return
        self._apply(num_accepted_tokens, state_indices, query_start_loc,
                    None if request_indices is None else request_indices[:B], block_table, num_computed_tokens,
                    mamba_block_size)

    def _apply(self, num_accepted_tokens, state_indices, query_start_loc, requests, block_table, num_computed_tokens,
               mamba_block_size) -> None:
        """The checked commit of a non-empty batch (``requests``: ``[B]`` or None): kda's
        records per slot and rule in the designs' launches (``commit_layers_and_conv``);
        otherwise the plan first, then the rule's plan folded."""
        B = state_indices.shape[0]
        rows = None if self.records == "batch_row" else self.slot_rows[:B]
        if self.records == "slot" and (self.rule == "kda" or block_table is None):
            commit_layers_and_conv(self.tables, self.conv, self.lower_bound, state_indices, self.plan.rows(B), rows,
                                   RequestPlan(num_accepted_tokens, query_start_loc, requests, block_table,
                                               num_computed_tokens, mamba_block_size))
            return
        plan = plan_per_request(self.plan, num_accepted_tokens, query_start_loc, state_indices, self.spec_query_len,
                                requests, rows, block_table, num_computed_tokens, mamba_block_size)
        if block_table is not None:
            plan = apply_rule(self.rule, plan, self.folds, requests, num_computed_tokens, mamba_block_size)
        commit_layers_and_conv(self.tables, self.conv, self.lower_bound, state_indices, plan, rows)
