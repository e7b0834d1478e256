"""Cutting a trace down: events, batch rows, requests, heads, window length, and the
renumbering of state slots and record rows that keeps only those still named.

Every function takes a ``Tape`` and returns a new one; inputs and initial buffers are
rewritten consistently so that the result is a valid trace. Except ``cut_events``, they
drop the expected results (the rows, heads and windows they describe no longer exist):
the caller regenerates them (``traces.repro.shrink``).

Rows of a plan are positional: a plan or flush writes plan rows ``0..B-1`` and the defer and
commit events after it read them by batch row. Such a run of events is one *row space*;
removing batch row b removes it from every event of its space (and from the initial plan
when the space starts before any plan; each op's ``row_space`` and ``reads_plan``,
``traces.ops``, say where it stands). A trace of several layers (format v2) can lose a
layer (``drop_layer``) and heads (``keep_heads``); the row, request and window cuts and
``compact`` are for traces of one layer without conv state (format v1). A verify is a row space of its own; a ``write`` has
no batch rows and belongs to none, and is cut like the buffers it writes.
"""

from __future__ import annotations

from typing import Callable

import torch

from traces.format.schema import NULL_ID, PLAN_FIELDS, SHARED_BUFFERS
from traces.format.tape import LayerTensors, Step, Tape
from traces.ops.table import OPS
from traces.replay.play import rebased

_SLOT_INPUTS = ("state_indices", "block_table", "slots")
_ROW_INPUTS = ("record_indices", "record_rows", "rows")
_BATCH_INPUTS = ("state_indices", "record_indices", "record_rows", "num_accepted", "num_computed", "eager",
                 "block_table")
_ACTIVATIONS = ("q", "k", "v", "raw_g", "raw_beta")


def cut_events(tape: Tape, start: int, stop: int, oracle, device: str = "cpu",
               progress: Callable[[int, int], None] | None = None) -> Tape:
    """Events ``start..stop-1`` with their recorded expected results; the initial buffers
    are the state before ``start`` (``traces.replay.play.rebased``; ``progress(done, start)``
    follows each event run to build them). The final buffers are kept only when ``stop``
    is the end."""
    n = len(tape.steps)
    if not 0 <= start < stop <= n:
        raise ValueError(f"events {start}:{stop}: the trace has events 0..{n - 1}")
    out = rebased(tape, start, oracle, device, progress)
    return out.with_steps(out.steps[: stop - start], final=out.final if stop == n else {})


def drop_layer(tape: Tape, layer: int) -> Tape:
    """Without layer ``layer`` (of a tape of several): its buffers, parameters and per-layer
    events; the layers after it move down one, ``commit_layers`` commits the others."""
    if tape.num_layers < 2:
        raise ValueError("a trace of one layer keeps it")
    layers = [tape.layer(i) for i in range(tape.num_layers) if i != layer]
    plan = {role: tape.initial[role] for role in SHARED_BUFFERS}
    steps = []
    for s in tape.steps:
        at, per_layer = s.attrs.get("layer", 0), OPS[s.op].per_layer
        if per_layer and at == layer:
            continue
        attrs = {**s.attrs, "layer": at - 1} if per_layer and at > layer else dict(s.attrs)
        steps.append(Step(s.op, s.inputs, {}, attrs))
    return tape.with_layers([LayerTensors(x.params, x.initial) for x in layers], plan, steps=steps)


def row_spaces(tape: Tape) -> list[list[int]]:
    """Step indices grouped by row space (module docstring); the first group holds the
    plan readers before any plan writer, when there are some."""
    spaces: list[list[int]] = []
    readers: list[int] = []
    current = readers
    for i, s in enumerate(tape.steps):
        where = OPS[s.op].row_space
        if where is None:
            continue
        if where == "own":
            spaces.append([i])
        elif where == "opens":
            current = [i]
            spaces.append(current)
        else:
            current.append(i)
    return ([readers] if readers else []) + spaces


def drop_rows(tape: Tape, space: list[int], rows: list[int]) -> Tape:
    """Remove batch ``rows`` from every step of ``space`` (and from the initial plan when
    the space reads it)."""
    drop = set(rows)
    steps = list(tape.steps)
    for i in space:
        steps[i] = _without_rows(steps[i], drop)
    initial = tape.initial
    if OPS[tape.steps[space[0]].op].reads_plan:
        initial = dict(initial)
        for f in PLAN_FIELDS:
            col = initial[f"plan.{f}"]
            keep = [j for j in range(col.shape[0]) if j not in drop]
            initial[f"plan.{f}"] = torch.cat([col[keep], torch.zeros(col.shape[0] - len(keep), dtype=col.dtype)])
    return tape.with_steps(steps, initial=initial, final={})


def drop_request(tape: Tape, slot: int) -> Tape:
    """Remove every row whose source slot is ``slot`` (``<= NULL_ID``: every padding row)."""
    out = tape
    for space in row_spaces(tape):
        head = tape.steps[space[0]].inputs["state_indices"].long()
        hit = head <= NULL_ID if slot <= NULL_ID else head == slot
        rows = hit.nonzero().flatten().tolist()
        if rows and len(rows) < head.shape[0]:
            out = drop_rows(out, space, rows)
    return out


def keep_heads(tape: Tape, heads: list[int]) -> Tape:
    """Only the given heads: every layer's parameters and buffers and the activations cut
    along the head axis (a conv state has no head axis: it stays)."""
    K = tape.dims.K
    idx = torch.tensor(heads, dtype=torch.long)
    cols = (idx[:, None] * K + torch.arange(K)[None, :]).reshape(-1)

    def cut(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor]) -> LayerTensors:
        buffers = dict(buffers)
        for role in ("checkpoint_state", "records.correction", "records.key_gate"):
            buffers[role] = buffers[role][:, idx]
        return LayerTensors({"A_log": params["A_log"][idx], "dt_bias": params["dt_bias"][cols]}, buffers)

    layers = [cut(x.params, x.initial) for x in (tape.layer(i) for i in range(tape.num_layers))]
    steps = []
    for s in tape.steps:
        inputs = dict(s.inputs)
        for role in _ACTIVATIONS:
            if role in inputs:
                inputs[role] = inputs[role][:, :, idx]
        for role in ("states", "records.correction", "records.key_gate"):  # a write's contents
            if role in inputs:
                inputs[role] = inputs[role][:, idx]
        if "A_log" in inputs:
            inputs["A_log"] = inputs["A_log"][idx]
        if "dt_bias" in inputs:
            inputs["dt_bias"] = inputs["dt_bias"][cols]
        steps.append(Step(s.op, inputs, {}, dict(s.attrs)))
    dims = type(tape.dims)(len(heads), K, tape.dims.V, tape.dims.T)
    plan = {role: tape.initial[role] for role in SHARED_BUFFERS}
    return tape.with_layers(layers, plan, steps=steps, dims=dims)


def shorten_windows(tape: Tape, T: int) -> Tape:
    """Window length ``T`` (< the tape's): each verify row keeps its first ``T`` tokens,
    record buffers keep ``T`` positions, counts are clamped to ``T``."""
    initial = _clamped_to_window(tape.initial, T)
    steps = []
    for s in tape.steps:
        inputs = _clamped_to_window(s.inputs, T)
        if "query_start_loc" in inputs:
            lens = _lens(inputs["query_start_loc"])
            if OPS[s.op].tokens:
                keep = [t for b, n in enumerate(lens) for t in range(_start(lens, b), _start(lens, b) + min(n, T))]
                for role in _ACTIVATIONS:
                    inputs[role] = inputs[role][:, keep]
            inputs["query_start_loc"] = _qsl([min(n, T) for n in lens])
        steps.append(Step(s.op, inputs, {}, dict(s.attrs)))
    dims = type(tape.dims)(tape.dims.H, tape.dims.K, tape.dims.V, T)
    return tape.with_steps(steps, dims=dims, initial=initial, final={})


def compact(tape: Tape) -> Tape:
    """Renumber state slots and record rows to those the events name (in order), and cut
    the plan to the largest batch that reads it. Semantics are unchanged."""
    steps = [Step(s.op, _explicit_rows(s), s.expected, s.attrs) for s in tape.steps]
    initial = dict(tape.initial)
    plan_rows = max([s.batch for s in steps if OPS[s.op].plan_rows] + [1])
    for f in PLAN_FIELDS:
        initial[f"plan.{f}"] = initial[f"plan.{f}"][:plan_rows]
    slot_refs = [s.inputs[r] for s in steps for r in _SLOT_INPUTS if r in s.inputs]
    slot_refs += [initial["plan.final_state_indices"], initial["plan.boundary_state_indices"]]
    slots = sorted({int(v) for t in slot_refs for v in t.reshape(-1).tolist() if v > NULL_ID})
    slot_map = torch.full((initial["checkpoint_state"].shape[0],), NULL_ID, dtype=torch.int64)
    slot_map[slots] = torch.arange(1, len(slots) + 1)
    pool = initial["checkpoint_state"]
    initial["checkpoint_state"] = torch.cat([pool[:1], pool[slots]])
    for f in ("final_state_indices", "boundary_state_indices"):
        initial[f"plan.{f}"] = _remap(initial[f"plan.{f}"], slot_map, NULL_ID)
    rows = sorted({int(v) for s in steps for r in _ROW_INPUTS if r in s.inputs
                   for v in s.inputs[r].reshape(-1).tolist() if v >= 0}) or [0]
    row_map = torch.full((initial["pending"].shape[0],), -1, dtype=torch.int64)
    row_map[rows] = torch.arange(len(rows))
    for role in ("records.correction", "records.key_gate", "pending"):
        initial[role] = initial[role][rows]
    out = []
    for s in steps:
        inputs = dict(s.inputs)
        for r in _SLOT_INPUTS:
            if r in inputs:
                inputs[r] = _remap(inputs[r], slot_map, NULL_ID)
        for r in _ROW_INPUTS:
            if r in inputs:
                inputs[r] = _remap(inputs[r], row_map, -1)
        if "pending" in inputs:  # a write of the whole buffers, cut as the initial ones
            inputs["pending"] = inputs["pending"][rows]
        for f in PLAN_FIELDS:
            if f"plan.{f}" in inputs:
                col = inputs[f"plan.{f}"][:plan_rows]
                inputs[f"plan.{f}"] = _remap(col, slot_map, NULL_ID) if "state_indices" in f else col
        out.append(Step(s.op, inputs, {}, dict(s.attrs)))
    return tape.with_steps(out, initial=initial, final={})


def _clamped_to_window(tensors: dict[str, torch.Tensor], T: int) -> dict[str, torch.Tensor]:
    """Buffers (initial ones, or a write's) for window length ``T``: records keep ``T``
    positions, counts are clamped to ``T``."""
    out = dict(tensors)
    for role in ("records.correction", "records.key_gate"):
        if role in out:
            out[role] = out[role][:, :, :T].contiguous()
    for role in ("pending", "plan.commit_lens", "plan.boundary_recovery_lens"):
        if role in out:
            out[role] = out[role].clamp(max=T)
    return out


def _remap(t: torch.Tensor, mapping: torch.Tensor, floor: int) -> torch.Tensor:
    """Values ``> floor`` go through ``mapping``; the others stay."""
    v = t.long()
    mapped = mapping[v.clamp(min=0, max=mapping.shape[0] - 1)]
    return torch.where(v > floor, mapped, v).to(t.dtype)


def _explicit_rows(s: Step) -> dict[str, torch.Tensor]:
    """Inputs with the default record rows (row b) of an op that takes ``record_indices``
    (verify, commit) written out."""
    inputs = dict(s.inputs)
    if "record_indices" in OPS[s.op].inputs and "record_indices" not in inputs:
        inputs["record_indices"] = torch.arange(s.batch, dtype=torch.int32)
    return inputs


def _lens(qsl: torch.Tensor) -> list[int]:
    v = qsl.long()
    return (v[1:] - v[:-1]).tolist()


def _start(lens: list[int], b: int) -> int:
    return sum(lens[:b])


def _qsl(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens, dtype=torch.long).cumsum(0).tolist()], dtype=torch.int32)


def _without_rows(s: Step, drop: set[int]) -> Step:
    inputs = _explicit_rows(s)
    keep = [b for b in range(s.batch) if b not in drop]
    idx = torch.tensor(keep, dtype=torch.long)
    for role in _BATCH_INPUTS:
        if role in inputs:
            inputs[role] = inputs[role][idx]
    if "query_start_loc" in inputs:
        lens = _lens(inputs["query_start_loc"])
        if OPS[s.op].tokens:
            tokens = [t for b in keep for t in range(_start(lens, b), _start(lens, b) + lens[b])]
            for role in _ACTIVATIONS:
                inputs[role] = inputs[role][:, tokens]
        inputs["query_start_loc"] = _qsl([lens[b] for b in keep])
    return Step(s.op, inputs, {}, dict(s.attrs))


__all__ = ["compact", "cut_events", "drop_layer", "drop_request", "drop_rows", "keep_heads", "row_spaces", "shorten_windows"]
