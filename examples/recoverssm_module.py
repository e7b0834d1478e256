"""The example engine's RecoverSSM module, as a serving engine carries it.

It exposes the documented surface (``kda_recoverssm_verify``, ``KDARecoverSSMRecords``,
``_defer_commit_kernel``, ``_prepare_flush_plan_kernel``; docs/implementations.md) and the plan,
commit and buffers the engine uses, all kda's own, and a commit context of its own
(``KDARecoverSSMCommitContext``: the engine's commit of every layer, written over the plan and
commit above with torch for the rest). ``examples/serve_engine.py`` calls it only through these
attributes, so ``kda record run --patch examples.recoverssm_module`` records the engine
unedited, and ``kda replay --impl examples/recoverssm_module.py`` replays through it.

``KDA_EXAMPLE_BUG``, read at import, turns on a bug to reproduce:

- ``commit-len``: a stale per-slot cache makes the commit fold one record too many (``n + 1``,
  at most ``T``) on each row whose slot was last committed for another record row (a slot
  reused by a new request). The cache reads the plan on the host, so that commit cannot be
  captured in a CUDA graph.
- ``conv-window``: the commit context's conv compaction takes layer 1's window one position
  early on rows that accept all ``T`` tokens (entries ``T - 2 ..`` instead of ``T - 1 ..``).
"""

from __future__ import annotations

import os

import torch

from kernels import (
    NULL_BLOCK_ID,
    CommitPlan,
    KDARecoverSSMRecords,
    allocate_records,
    defer_commit_kernel,
    kda_recoverssm_plan,
    kda_recoverssm_verify,
    prepare_flush_plan_kernel,
)
from kernels import kda_recoverssm_commit as _kda_commit

_defer_commit_kernel = defer_commit_kernel
_prepare_flush_plan_kernel = prepare_flush_plan_kernel
"""The documented surface names its raw kernels with a leading underscore (docs/implementations.md):
kda's own kernels under those names."""

BUG_VARIABLE = "KDA_EXAMPLE_BUG"
BUGS = ("commit-len", "conv-window")


class StaleSlotCommit:
    """``kda_recoverssm_commit`` with the ``commit-len`` bug: it remembers, per state pool and
    slot, the record row it last folded into that slot; a row whose slot it remembers for
    another record row folds ``min(commit_lens[b] + 1, T)`` records. Rows that fold nothing
    leave the cache alone."""

    def __init__(self):
        self.last_row: dict[tuple[int, int], int] = {}

    def __call__(self, checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, plan,
                 record_indices=None) -> None:
        B = state_indices.shape[0]
        rows = record_indices.tolist() if record_indices is not None else list(range(B))
        lens = plan.commit_lens[:B].to("cpu", copy=True)
        for b, (slot, row) in enumerate(zip(state_indices.tolist(), rows)):
            if slot <= NULL_BLOCK_ID or row < 0 or lens[b] <= 0:
                continue
            key = (checkpoint_state.data_ptr(), slot)
            if self.last_row.get(key, row) != row:
                lens[b] = min(int(lens[b]) + 1, records.spec_query_len)
            self.last_row[key] = row
        stale = CommitPlan(lens.to(plan.commit_lens.device), plan.final_state_indices[:B],
                           plan.boundary_state_indices[:B], plan.boundary_recovery_lens[:B])
        _kda_commit(checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, stale,
                    record_indices=record_indices)


class EngineCommitContext:
    """The engine's commit of every KDA layer after sampling (docs/design.md §10), as the
    engine writes it: the plan through ``kda_recoverssm_plan`` on the rows' requests, the conv
    windows moved with torch, then ``kda_recoverssm_commit`` on each layer with its records
    kept per slot. Buffers are allocated in ``create`` (an align block table's on the first
    commit of its width); a commit reads no value on the host, so a decode step with its
    commit can be captured in a CUDA graph. ``plan`` (``CommitPlan`` of at least
    ``max_num_reqs`` rows) is the plan each commit fills; a caller may set another."""

    def __init__(self, layers, spec_query_len: int, max_num_reqs: int, conv_dim_first: bool):
        first = layers[0]
        conv, state = first.kv_cache[0], first.kv_cache[1]
        device = state.device
        convs = [layer.kv_cache[0] if conv_dim_first else layer.kv_cache[0].transpose(1, 2) for layer in layers]
        self.history = convs[0].shape[2] - spec_query_len + 1
        self.layers = tuple(layers)
        self.records = [KDARecoverSSMRecords(layer.kv_cache[2], layer.kv_cache[3]) for layer in layers]
        self.windows = [c.unfold(2, self.history, 1) for c in convs]  # [N, dim, T, history]: a window per start
        self.heads = [c.narrow(2, 0, self.history) for c in convs]  # [N, dim, history]: where windows go
        self.spec_query_len, self.max_num_reqs = spec_query_len, max_num_reqs
        self.lower_bound = first.gate_lower_bound
        self.plan = CommitPlan.allocate(max_num_reqs, device)
        rows = 2 * max_num_reqs  # each row's final copy, then its boundary copy

        def int_column(n: int, dtype=torch.int32) -> torch.Tensor:
            return torch.zeros(n, dtype=dtype, device=device)

        self.accepted, self.computed, self.slot_rows = (int_column(max_num_reqs) for _ in range(3))
        self.sources, self.starts, self.dests = (int_column(rows, torch.int64) for _ in range(3))
        self.moved = torch.empty(rows, convs[0].shape[1], self.history, dtype=conv.dtype, device=device)
        self.tables: dict[int, torch.Tensor] = {}

    @classmethod
    def create(cls, layers, spec_query_len: int, max_num_reqs: int, conv_dim_first: bool = True):
        """The context of ``layers`` (objects with ``kv_cache = (conv_state, checkpoint_state,
        correction, key_gate)``, ``A_log``, ``dt_bias``, ``gate_lower_bound``; conv states
        ``[N, dim, S]``, or ``[N, S, dim]`` when not ``conv_dim_first``; records ``[N, H, T,
        ...]``, a row per slot) for windows of ``spec_query_len`` tokens and up to
        ``max_num_reqs`` rows. ``S - spec_query_len + 1`` history entries are kept. Raises
        ``ValueError`` on a conv state or records that do not fit."""
        layers = tuple(layers)
        if not layers:
            raise ValueError("layers: expected at least one layer")
        for i, layer in enumerate(layers):
            conv, state, correction, _ = layer.kv_cache
            entries = conv.shape[2 if conv_dim_first else 1] if conv.dim() == 3 else 0
            if conv.shape[:1] != state.shape[:1] or entries <= spec_query_len - 1:
                raise ValueError(f"layers[{i}].kv_cache[0]: expected a conv state of more than {spec_query_len - 1} "
                                 f"entries per slot of {state.shape[0]}, got {tuple(conv.shape)}")
            if correction.shape[:1] != state.shape[:1] or correction.shape[2] != spec_query_len:
                raise ValueError(f"layers[{i}].kv_cache[2]: expected a record row of {spec_query_len} tokens per "
                                 f"slot, got {tuple(correction.shape)}")
        return cls(layers, spec_query_len, max_num_reqs, conv_dim_first)

    def commit(self, num_accepted_tokens, state_indices, query_start_loc, request_indices=None, block_table=None,
               num_computed_tokens=None, mamba_block_size=None) -> None:
        """Fold each row's accepted tokens into every layer. ``state_indices`` int32 ``[B]``
        (a strided column allowed), ``query_start_loc`` int32 ``[B+1]``; per-request tensors
        (``num_accepted_tokens``; align mode: ``block_table [requests, width]``,
        ``num_computed_tokens``, with ``mamba_block_size``) are read at ``request_indices[b]``
        for row ``b``, or at ``b``. Raises ``ValueError`` past ``max_num_reqs`` rows."""
        B = state_indices.shape[0]
        if B > self.max_num_reqs:
            raise ValueError(f"state_indices: {B} rows exceed max_num_reqs = {self.max_num_reqs}")
        if B == 0:
            return
        requests = None if request_indices is None else request_indices[:B]
        align = {}
        if block_table is not None:
            width = block_table.shape[1]
            if width not in self.tables:
                self.tables[width] = block_table.new_zeros(self.max_num_reqs, width)
            align = dict(block_table=_by_row(block_table, requests, self.tables[width][:B]),
                         num_computed=_by_row(num_computed_tokens, requests, self.computed[:B]),
                         block_size=mamba_block_size)
        plan = kda_recoverssm_plan(self.plan, _by_row(num_accepted_tokens, requests, self.accepted[:B]),
                                   query_start_loc, state_indices, self.spec_query_len, **align)
        self._move_conv_windows(state_indices, plan)
        record_rows = self.slot_rows[:B]
        record_rows.copy_(state_indices)
        for layer, records in zip(self.layers, self.records):
            kda_recoverssm_commit(layer.kv_cache[1], records, layer.A_log, layer.dt_bias, self.lower_bound,
                                  state_indices, plan, record_indices=record_rows)

    def _move_conv_windows(self, state_indices, plan: CommitPlan) -> None:
        """Every layer: a committing row's window ending at its last accepted token (entries
        ``n - 1 ..``) goes to entries ``0 .. history - 1`` of its final slot, and with a
        boundary the window ending at the boundary (``R - 1 ..``) to the boundary slot. Every
        window is read before any is written (the source may be a destination). A copy a row
        does not make reads and writes the null slot's first entries, which no other copy
        touches: every row copies, and no mask is read on the host."""
        B = state_indices.shape[0]
        n, final = plan.commit_lens, plan.final_state_indices
        commits = (state_indices > NULL_BLOCK_ID) & (n > 0) & (final > NULL_BLOCK_ID)
        bounded = commits & (plan.boundary_state_indices > NULL_BLOCK_ID) & (plan.boundary_recovery_lens > 0) & (
            plan.boundary_recovery_lens <= n)
        for part, (moves, start, dest) in enumerate(((commits, n, final), (bounded, plan.boundary_recovery_lens,
                                                                           plan.boundary_state_indices))):
            rows = slice(part * B, (part + 1) * B)
            self.sources[rows].copy_(torch.where(moves, state_indices, NULL_BLOCK_ID))
            self.starts[rows].copy_(torch.where(moves, start - 1, 0))
            self.dests[rows].copy_(torch.where(moves, dest, NULL_BLOCK_ID))
        sources, dests, moved = self.sources[:2 * B], self.dests[:2 * B], self.moved[:2 * B]
        for layer, (windows, heads) in enumerate(zip(self.windows, self.heads)):
            starts = self._window_starts(layer, self.starts[:2 * B], B)
            torch.ops.aten.index.Tensor_out(windows, [sources, None, starts], out=moved)
            heads.index_copy_(0, dests, moved)

    def _window_starts(self, layer: int, starts: torch.Tensor, B: int) -> torch.Tensor:
        """The entry each of ``layer``'s ``2B`` copies starts at (final copies, then boundary)."""
        return starts


class EarlyConvWindowContext(EngineCommitContext):
    """``EngineCommitContext`` with the ``conv-window`` bug: on layer 1, a row that accepts
    all ``T`` tokens moves the window starting one entry early (``T - 2``)."""

    def _window_starts(self, layer: int, starts: torch.Tensor, B: int) -> torch.Tensor:
        if layer != 1 or self.spec_query_len < 2:
            return starts
        full = torch.arange(starts.shape[0], device=starts.device) < B
        return starts - (full & (starts == self.spec_query_len - 1)).to(starts.dtype)


def _by_row(values: torch.Tensor, requests: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
    """``values`` of each row's request (``requests[b]``, or ``b``) gathered into ``out``."""
    if requests is None:
        return out.copy_(values[:out.shape[0]])
    return torch.index_select(values, 0, requests, out=out)


def _bug(name: str) -> str:
    if name not in ("", *BUGS):
        raise ValueError(f"{BUG_VARIABLE}={name}: expected one of {', '.join(BUGS)} (or unset)")
    return name


_BUG = _bug(os.environ.get(BUG_VARIABLE, ""))
kda_recoverssm_commit = StaleSlotCommit() if _BUG == "commit-len" else _kda_commit
KDARecoverSSMCommitContext = EarlyConvWindowContext if _BUG == "conv-window" else EngineCommitContext

__all__ = ["BUGS", "BUG_VARIABLE", "NULL_BLOCK_ID", "CommitPlan", "EarlyConvWindowContext", "EngineCommitContext",
           "KDARecoverSSMCommitContext", "KDARecoverSSMRecords", "StaleSlotCommit",
           "_defer_commit_kernel", "_prepare_flush_plan_kernel", "allocate_records", "kda_recoverssm_commit",
           "kda_recoverssm_plan", "kda_recoverssm_verify"]
