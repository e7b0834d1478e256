"""Argument checks shared by the Triton wrappers and the reference.

They read only shapes, dtypes, strides and devices, never tensor values, so they cost no
host synchronisation. Values (slot and record-row ranges) are checked where they enter
the tool: the trace reader. Every failure is a ``ValueError`` that names the argument.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.buffers import CommitPlan, KDARecoverSSMRecords
from kernels.commit_rules import COMMIT_RULES, RECORD_ROWS

ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float64)


@dataclass(frozen=True)
class VerifyDims:
    batch: int
    total_tokens: int
    num_heads: int
    head_k_dim: int
    head_v_dim: int
    spec_query_len: int
    num_slots: int
    num_record_rows: int


def _fail(name: str, message: str) -> None:
    raise ValueError(f"{name}: {message}")


def _require(cond: bool, name: str, message: str) -> None:
    if not cond:
        _fail(name, message)


def _check_index(name: str, t: torch.Tensor, length: int | None, allow_strided: bool) -> None:
    _require(isinstance(t, torch.Tensor), name, "expected a tensor")
    _require(t.dtype == torch.int32, name, f"expected int32, got {t.dtype}")
    _require(t.dim() == 1, name, f"expected 1 dimension, got shape {tuple(t.shape)}")
    if length is not None:
        _require(t.shape[0] == length, name, f"expected {length} elements, got {t.shape[0]}")
    if not allow_strided:
        _require(t.numel() <= 1 or t.stride(0) == 1, name, "expected a contiguous tensor")


def check_verify_args(
    q, k, v, raw_g, raw_beta, A_log, dt_bias, checkpoint_state, records, query_start_loc,
    state_indices, spec_query_len, out, record_indices,
) -> VerifyDims:
    """Check every rule of the verify contract; return the problem's dimensions."""
    for name, t in (("q", q), ("k", k), ("v", v), ("raw_g", raw_g), ("raw_beta", raw_beta)):
        _require(isinstance(t, torch.Tensor), name, "expected a tensor")
    _require(k.dim() == 4 and k.shape[0] == 1, "k", f"expected shape [1, T_tot, H, K], got {tuple(k.shape)}")
    _, total, heads, kdim = k.shape
    _require(k.dtype in ACTIVATION_DTYPES, "k", f"unsupported activation dtype {k.dtype}")
    act = k.dtype
    for name, t in (("q", q), ("raw_g", raw_g)):
        _require(tuple(t.shape) == (1, total, heads, kdim), name,
                 f"expected shape {(1, total, heads, kdim)}, got {tuple(t.shape)}")
    _require(v.dim() == 4 and tuple(v.shape[:3]) == (1, total, heads), "v",
             f"expected shape [1, {total}, {heads}, V], got {tuple(v.shape)}")
    vdim = v.shape[3]
    _require(tuple(raw_beta.shape) == (1, total, heads), "raw_beta",
             f"expected shape {(1, total, heads)}, got {tuple(raw_beta.shape)}")
    for name, t in (("q", q), ("v", v), ("raw_g", raw_g), ("raw_beta", raw_beta)):
        _require(t.dtype == act, name, f"expected {act} like k, got {t.dtype}")
    for name, t, inner in (("q", q, kdim), ("k", k, kdim), ("raw_g", raw_g, kdim), ("v", v, vdim)):
        _require(total == 0 or tuple(t.stride()[2:]) == (inner, 1), name,
                 f"heads must be contiguous (stride()[2:] == ({inner}, 1)), got {tuple(t.stride()[2:])}")
    _require(total == 0 or raw_beta.stride(2) == 1, "raw_beta", "expected stride(2) == 1")

    check_gate_params(A_log, dt_bias, heads, kdim)

    _require(isinstance(spec_query_len, int) and spec_query_len >= 1, "spec_query_len",
             f"expected a positive int, got {spec_query_len!r}")
    T = spec_query_len

    slots = check_state_pool(checkpoint_state, heads, kdim, vdim)
    rows = check_records(records, heads, T, kdim, vdim, act)

    _check_index("query_start_loc", query_start_loc, None, allow_strided=False)
    _require(query_start_loc.shape[0] >= 1, "query_start_loc", "expected [B+1] elements, got 0")
    batch = query_start_loc.shape[0] - 1
    _check_index("state_indices", state_indices, batch, allow_strided=True)
    if record_indices is not None:
        _check_index("record_indices", record_indices, batch, allow_strided=False)
    else:
        _require(batch <= rows, "records", f"{batch} rows need {batch} record rows, records hold {rows}")
    _require(total <= batch * T, "q", f"T_tot = {total} exceeds B*T = {batch}*{T}")

    if out is not None:
        _require(isinstance(out, torch.Tensor), "out", "expected a tensor")
        _require(tuple(out.shape) == tuple(v.shape), "out", f"expected shape {tuple(v.shape)}, got {tuple(out.shape)}")
        _require(out.dtype == act, "out", f"expected {act}, got {out.dtype}")
        _require(total == 0 or tuple(out.stride()[2:]) == (vdim, 1), "out", "heads must be contiguous")

    named = [("q", q), ("k", k), ("v", v), ("raw_g", raw_g), ("raw_beta", raw_beta), ("A_log", A_log),
             ("dt_bias", dt_bias), ("checkpoint_state", checkpoint_state),
             ("records.correction", records.correction), ("records.key_gate", records.key_gate),
             ("query_start_loc", query_start_loc), ("state_indices", state_indices)]
    if out is not None:
        named.append(("out", out))
    if record_indices is not None:
        named.append(("record_indices", record_indices))
    check_same_device(named)
    return VerifyDims(batch, total, heads, kdim, vdim, T, slots, rows)


def check_gate_params(A_log, dt_bias, heads: int, kdim: int) -> None:
    """Check the gate parameters: ``A_log`` float32 ``[H]``, ``dt_bias`` float32 ``H*K`` elements."""
    _require(isinstance(A_log, torch.Tensor) and A_log.dtype == torch.float32, "A_log", "expected a float32 tensor")
    _require(A_log.numel() == heads and A_log.dim() == 1 and A_log.is_contiguous(), "A_log",
             f"expected a contiguous [{heads}] tensor, got shape {tuple(A_log.shape)}")
    _require(isinstance(dt_bias, torch.Tensor) and dt_bias.dtype == torch.float32, "dt_bias", "expected a float32 tensor")
    _require(dt_bias.numel() == heads * kdim and dt_bias.is_contiguous(), "dt_bias",
             f"expected {heads * kdim} contiguous elements, got shape {tuple(dt_bias.shape)}")


def check_state_pool(checkpoint_state, heads: int | None, kdim: int | None, vdim: int | None) -> int:
    """Check the ``[N, H, V, K]`` checkpoint pool; return N."""
    name = "checkpoint_state"
    _require(isinstance(checkpoint_state, torch.Tensor), name, "expected a tensor")
    _require(checkpoint_state.dim() == 4, name, f"expected shape [N, H, V, K], got {tuple(checkpoint_state.shape)}")
    _require(checkpoint_state.dtype in STATE_DTYPES, name,
             f"expected float32 or bfloat16 (float64 for the reference), got {checkpoint_state.dtype}")
    _require(checkpoint_state.is_contiguous(), name, "expected a contiguous tensor")
    n, h, vd, kd = checkpoint_state.shape
    expected = (h if heads is None else heads, vd if vdim is None else vdim, kd if kdim is None else kdim)
    _require((h, vd, kd) == expected, name, f"expected [N, {expected[0]}, {expected[1]}, {expected[2]}], got {tuple(checkpoint_state.shape)}")
    return n


def check_records(records, heads: int, T: int, kdim: int, vdim: int, act: torch.dtype | None) -> int:
    """Check the record buffers against the problem's dimensions; return R."""
    _require(isinstance(records, KDARecoverSSMRecords), "records", "expected KDARecoverSSMRecords")
    corr, kg = records.correction, records.key_gate
    _require(corr.dim() == 4 and tuple(corr.shape[1:]) == (heads, T, vdim), "records.correction",
             f"expected [R, {heads}, {T}, {vdim}], got {tuple(corr.shape)}")
    _require(corr.dtype in (torch.float32, torch.float64), "records.correction",
             f"expected float32 (float64 for the reference), got {corr.dtype}")
    _require(corr.is_contiguous(), "records.correction", "expected a contiguous tensor")
    _require(kg.dim() == 4 and tuple(kg.shape) == (corr.shape[0], heads, T, 2 * kdim), "records.key_gate",
             f"expected [{corr.shape[0]}, {heads}, {T}, {2 * kdim}], got {tuple(kg.shape)}")
    if act is not None:
        _require(kg.dtype == act, "records.key_gate", f"expected {act} like k, got {kg.dtype}")
    else:
        _require(kg.dtype in ACTIVATION_DTYPES, "records.key_gate", f"unsupported activation dtype {kg.dtype}")
    _require(kg.is_contiguous(), "records.key_gate", "expected a contiguous tensor")
    return corr.shape[0]


def check_same_device(named: list[tuple[str, torch.Tensor]]) -> None:
    device = named[0][1].device
    for name, t in named:
        _require(t.device == device, name, f"on {t.device}, expected {device} like {named[0][0]}")


PLAN_COLUMNS = ("commit_lens", "final_state_indices", "boundary_state_indices", "boundary_recovery_lens")


def plan_columns(plan: CommitPlan) -> list[tuple[str, torch.Tensor]]:
    """The plan's four columns, named as errors name them."""
    return [(f"plan.{name}", getattr(plan, name)) for name in PLAN_COLUMNS]


def check_plan(plan, batch: int) -> None:
    """Four contiguous int32 columns of at least ``batch`` rows each, no two overlapping."""
    _require(isinstance(plan, CommitPlan), "plan", "expected a CommitPlan")
    columns = plan_columns(plan)
    for name, t in columns:
        _check_index(name, t, None, allow_strided=False)
        _require(t.shape[0] >= batch, name, f"holds {t.shape[0]} rows, the batch has {batch}")
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for _, t in columns if t.numel())
    _require(all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), "plan",
             "its four tensors must not overlap in memory")


def check_commit_args(checkpoint_state, records, A_log, dt_bias, state_indices, plan, record_indices) -> tuple[int, int, int, int]:
    """Check a commit's arguments; return (B, H, K, V)."""
    check_state_pool(checkpoint_state, None, None, None)
    _, heads, vdim, kdim = checkpoint_state.shape
    check_records(records, heads, records.spec_query_len, kdim, vdim, None)
    check_gate_params(A_log, dt_bias, heads, kdim)
    _check_index("state_indices", state_indices, None, allow_strided=True)
    batch = state_indices.shape[0]
    check_plan(plan, batch)
    if record_indices is not None:
        _check_index("record_indices", record_indices, batch, allow_strided=False)
    else:
        _require(batch <= records.num_rows, "records", f"{batch} rows need {batch} record rows, records hold {records.num_rows}")
    named = [("checkpoint_state", checkpoint_state), ("records.correction", records.correction),
             ("records.key_gate", records.key_gate), ("A_log", A_log), ("dt_bias", dt_bias),
             ("state_indices", state_indices), *plan_columns(plan)]
    if record_indices is not None:
        named.append(("record_indices", record_indices))
    check_same_device(named)
    return batch, heads, kdim, vdim


def check_layer_buffers(layers) -> None:
    """Check several layers' commit buffers (``LayerBuffers``): each a valid pool, records and
    gate of one shape, and every layer's like the first's in shape, dtype and device (a
    kernel reads them all through one set of element types); no two layers' state or records
    start at one address (a commit would fold them twice)."""
    _require(len(layers) >= 1, "layers", "expected at least one layer")
    first = layers[0]
    for i, layer in enumerate(layers):
        _require(all(hasattr(layer, name) for name in ("checkpoint_state", "records", "A_log", "dt_bias")),
                 f"layers[{i}]", "expected checkpoint_state, records, A_log and dt_bias")
        check_state_pool(layer.checkpoint_state, None, None, None)
        _, heads, vdim, kdim = layer.checkpoint_state.shape
        check_records(layer.records, heads, layer.records.spec_query_len, kdim, vdim, None)
        check_gate_params(layer.A_log, layer.dt_bias, heads, kdim)
        for name in ("checkpoint_state", "records.correction", "records.key_gate", "A_log", "dt_bias"):
            t, t0 = _attribute(layer, name), _attribute(first, name)
            _require(t.shape == t0.shape and t.dtype == t0.dtype and t.device == t0.device, f"layers[{i}].{name}",
                     f"expected {tuple(t0.shape)} {t0.dtype} on {t0.device} like layers[0], "
                     f"got {tuple(t.shape)} {t.dtype} on {t.device}")
        for name in ("checkpoint_state", "records.correction", "records.key_gate"):
            start = _attribute(layer, name).data_ptr()
            earlier = [j for j in range(i) if _attribute(layers[j], name).data_ptr() == start]
            _require(not earlier, f"layers[{i}].{name}",
                     f"starts where layers[{earlier[0] if earlier else 0}]'s does: each layer needs buffers of its own")


def _attribute(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def check_flush_args(checkpoint_state, records, A_log, dt_bias, state_indices, record_rows, pending, plan) -> None:
    """Check both halves of a flush (its plan, then its commit of ``record_rows``) before the
    plan consumes any count."""
    check_pending_args(state_indices, record_rows, pending, plan, records=records)
    check_commit_args(checkpoint_state, records, A_log, dt_bias, state_indices, plan, record_rows)


def check_plan_args(plan, num_accepted, query_start_loc, state_indices, spec_query_len,
                    block_table, num_computed, block_size) -> int:
    """Check a commit plan's arguments; return B."""
    _check_index("state_indices", state_indices, None, allow_strided=True)
    batch = state_indices.shape[0]
    _check_index("num_accepted", num_accepted, batch, allow_strided=False)
    _check_index("query_start_loc", query_start_loc, batch + 1, allow_strided=False)
    _require(isinstance(spec_query_len, int) and spec_query_len >= 1, "spec_query_len",
             f"expected a positive int, got {spec_query_len!r}")
    check_plan(plan, batch)
    named = [("state_indices", state_indices), ("num_accepted", num_accepted),
             ("query_start_loc", query_start_loc), *plan_columns(plan)]
    align = (block_table is not None, num_computed is not None, block_size is not None)
    _require(all(align) or not any(align), "block_table",
             "align mode needs block_table, num_computed and block_size together")
    if block_table is not None:
        _require(isinstance(block_table, torch.Tensor) and block_table.dtype == torch.int32
                 and block_table.dim() == 2 and block_table.shape[0] == batch
                 and block_table.stride(1) == 1, "block_table",
                 f"expected int32 [{batch}, width] with contiguous columns")
        _require(block_table.shape[1] >= 1, "block_table", "has width 0; align mode needs at least one column")
        _check_index("num_computed", num_computed, batch, allow_strided=False)
        _require(isinstance(block_size, int) and block_size >= spec_query_len, "block_size",
                 f"expected an int >= spec_query_len ({spec_query_len}), got {block_size!r}")
        named += [("block_table", block_table), ("num_computed", num_computed)]
    check_same_device(named)
    return batch


def check_pending_args(state_indices, record_rows, pending, plan, eager=None, records=None) -> int:
    """Check the deferred-commit arguments (with ``records``, also that ``pending`` holds a
    count for each of its rows); return B."""
    _check_index("state_indices", state_indices, None, allow_strided=True)
    batch = state_indices.shape[0]
    _check_index("record_rows", record_rows, batch, allow_strided=False)
    _check_index("pending", pending, None, allow_strided=False)
    if records is not None:
        _require(pending.shape[0] >= records.num_rows, "pending",
                 f"holds {pending.shape[0]} counts, records hold {records.num_rows} rows")
    check_plan(plan, batch)
    named = [("state_indices", state_indices), ("record_rows", record_rows), ("pending", pending),
             *plan_columns(plan)]
    if eager is not None:
        _require(isinstance(eager, torch.Tensor) and eager.dim() == 1 and eager.shape[0] == batch
                 and eager.dtype in (torch.bool, torch.int8, torch.uint8, torch.int32), "eager",
                 f"expected a [{batch}] bool or integer tensor")
        _require(eager.numel() <= 1 or eager.stride(0) == 1, "eager", "expected a contiguous tensor")
        named.append(("eager", eager))
    check_same_device(named)
    return batch


def check_context_layers(layers, spec_query_len, max_num_reqs, conv_dim_first: bool, records: str = "slot",
                         rule: str = "kda") -> None:
    """Check the layers of a commit context (``CommitLayer``s, docs/design.md §10): the four
    buffers of ``kv_cache``, records per slot (or, ``records="batch_row"``, a row for each of
    ``max_num_reqs``), the declared heads and head size, one lower bound, conv states of one
    shape with at least one history entry; ``records`` and ``rule`` among
    ``kernels.commit_rules``'s. The buffers' agreement across layers is
    ``check_layer_buffers``'s, which ``LayerTables.of`` runs."""
    _require(records in RECORD_ROWS, "records", f"expected one of {', '.join(RECORD_ROWS)}, got {records!r}")
    _require(rule in COMMIT_RULES, "rule", f"expected one of {', '.join(COMMIT_RULES)}, got {rule!r}")
    _require(isinstance(spec_query_len, int) and spec_query_len >= 1, "spec_query_len",
             f"expected a positive int, got {spec_query_len!r}")
    _require(isinstance(max_num_reqs, int) and max_num_reqs >= 1, "max_num_reqs",
             f"expected a positive int, got {max_num_reqs!r}")
    _require(len(layers) >= 1, "layers", "expected at least one layer")
    for i, layer in enumerate(layers):
        name = f"layers[{i}]"
        kv = layer.kv_cache
        _require(isinstance(kv, (tuple, list)) and len(kv) == 4 and all(isinstance(t, torch.Tensor) for t in kv),
                 f"{name}.kv_cache", "expected (conv_state, checkpoint_state, correction, key_gate) tensors")
        conv, state, correction, key_gate = kv
        check_state_pool(state, None, None, None)
        slots, heads, vdim, kdim = state.shape
        _require((layer.local_num_heads, layer.head_dim) == (heads, kdim), name,
                 f"local_num_heads={layer.local_num_heads}, head_dim={layer.head_dim} do not match its "
                 f"checkpoint [N, H, V, K] = {tuple(state.shape)}")
        if records == "slot":
            _require(correction.dim() == 4 and correction.shape[0] == slots, f"{name}.kv_cache[2]",
                     f"expected a record row per slot, [{slots}, {heads}, {spec_query_len}, {vdim}], "
                     f"got {tuple(correction.shape)}")
        else:
            _require(correction.dim() == 4 and correction.shape[0] >= max_num_reqs, f"{name}.kv_cache[2]",
                     f"expected a record row per batch row, [>= {max_num_reqs}, {heads}, {spec_query_len}, {vdim}], "
                     f"got {tuple(correction.shape)}")
        _require(correction.shape[2] == spec_query_len, f"{name}.kv_cache[2]",
                 f"expected {spec_query_len} tokens a row (spec_query_len), got shape {tuple(correction.shape)}")
        _require(layer.gate_lower_bound == layers[0].gate_lower_bound, f"{name}.gate_lower_bound",
                 f"{layer.gate_lower_bound} differs from layers[0]'s {layers[0].gate_lower_bound}")
        _require(conv.dim() == 3 and conv.shape[0] == slots, f"{name}.kv_cache[0]",
                 f"expected a conv state per slot, [{slots}, dim, S] or [{slots}, S, dim], got {tuple(conv.shape)}")
        history = conv.shape[2 if conv_dim_first else 1] - spec_query_len + 1
        _require(history >= 1, f"{name}.kv_cache[0]",
                 f"its {history + spec_query_len - 1} entries a channel hold no history before a window of "
                 f"{spec_query_len} (conv_dim_first={conv_dim_first})")
        first_conv = layers[0].kv_cache[0]
        _require(conv.shape == first_conv.shape and conv.dtype == first_conv.dtype
                 and conv.device == state.device, f"{name}.kv_cache[0]",
                 f"expected {tuple(first_conv.shape)} {first_conv.dtype} on {state.device}, "
                 f"got {tuple(conv.shape)} {conv.dtype} on {conv.device}")


def check_commit_context_args(context, num_accepted, state_indices, query_start_loc, request_indices, block_table,
                              num_computed, block_size) -> int:
    """Check a context commit's arguments (``KDARecoverSSMCommitContext.commit``); return B."""
    _check_index("state_indices", state_indices, None, allow_strided=True)
    batch = state_indices.shape[0]
    _require(batch <= context.max_num_reqs, "state_indices",
             f"{batch} rows exceed the context's max_num_reqs = {context.max_num_reqs}")
    _check_index("query_start_loc", query_start_loc, batch + 1, allow_strided=False)
    _check_index("num_accepted_tokens", num_accepted, None, allow_strided=False)
    named = [("state_indices", state_indices), ("query_start_loc", query_start_loc),
             ("num_accepted_tokens", num_accepted)]
    if request_indices is not None:
        _check_index("request_indices", request_indices, None, allow_strided=False)
        _require(request_indices.shape[0] >= batch, "request_indices",
                 f"holds {request_indices.shape[0]} rows, the batch has {batch}")
        named.append(("request_indices", request_indices))
    else:
        _require(num_accepted.shape[0] >= batch, "num_accepted_tokens",
                 f"holds {num_accepted.shape[0]} counts, the batch has {batch} rows (no request_indices)")
    align = (block_table is not None, num_computed is not None, block_size is not None)
    _require(all(align) or not any(align), "block_table",
             "align mode needs block_table, num_computed_tokens and mamba_block_size together")
    if block_table is not None:
        _require(isinstance(block_table, torch.Tensor) and block_table.dtype == torch.int32
                 and block_table.dim() == 2 and block_table.stride(1) == 1 and block_table.shape[1] >= 1,
                 "block_table", "expected int32 [requests, width >= 1] with contiguous columns")
        _check_index("num_computed_tokens", num_computed, None, allow_strided=False)
        if request_indices is None:
            _require(block_table.shape[0] >= batch and num_computed.shape[0] >= batch, "block_table",
                     f"block_table and num_computed_tokens need a row for each of the {batch} rows")
        _require(isinstance(block_size, int) and block_size >= context.spec_query_len, "mamba_block_size",
                 f"expected an int >= spec_query_len ({context.spec_query_len}), got {block_size!r}")
        named += [("block_table", block_table), ("num_computed_tokens", num_computed)]
    named.append(("checkpoint_state", context.tables.first.checkpoint_state))
    check_same_device(named)
    return batch
