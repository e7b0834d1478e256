"""The tensor roles of a trace: what each buffer, parameter and op input or result is, by
role, with its shape in symbols (``traces.format.schema`` says which), dtype and value rule.
``traces.format.validate`` checks a trace's tensors against them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Role:
    """One tensor an op reads or writes.

    shape: symbols or ints (``traces.format.schema``'s docstring); ``B+1`` binds B from the length.
    dtype: ``act``, ``state``, ``float32``, ``int32`` or ``flag`` (bool, int8, uint8, int32).
    index: value rule for integer tensors: ``slot`` (PAD_ID <= i < N), ``real_slot``
           (NULL_ID < i < N), ``record_row`` (PAD_ID <= i < R), ``real_record_row``
           (0 <= i < R), ``request`` (0 <= i < Rq), ``qsl`` (query_start_loc),
           ``count`` (0 <= i <= T), ``nonneg`` (i >= 0), or None (any value).
    """

    shape: tuple[str | int, ...]
    dtype: str
    required: bool = True
    index: str | None = None


def _i32(shape: tuple[str | int, ...], index: str | None = None, required: bool = True) -> Role:
    return Role(shape, "int32", required, index)


PARAMS = {
    "A_log": Role(("H",), "float32"),
    "dt_bias": Role(("HK",), "float32"),
}

PLAN_FIELDS = ("commit_lens", "final_state_indices", "boundary_state_indices", "boundary_recovery_lens")

BUFFERS = {
    "checkpoint_state": Role(("N", "H", "V", "K"), "state"),
    "records.correction": Role(("R", "H", "T", "V"), "float32"),
    "records.key_gate": Role(("R", "H", "T", "2K"), "act"),
    "pending": _i32(("R",)),
    "plan.commit_lens": _i32(("P",), "count"),
    "plan.final_state_indices": _i32(("P",), "slot"),
    "plan.boundary_state_indices": _i32(("P",), "slot"),
    "plan.boundary_recovery_lens": _i32(("P",), "count"),
}
"""Buffers that live across events: the ``initial`` set (required) and ``final`` set (optional)."""
LAYER_BUFFERS = ("checkpoint_state", "records.correction", "records.key_gate", "pending")
"""The buffers each layer has of its own; the plan buffers are shared by all layers."""
SHARED_BUFFERS = tuple(role for role in BUFFERS if role not in LAYER_BUFFERS)
CONV_STATE = Role(("N", "conv1", "conv2"), "act")
"""A layer's conv state pool (role ``conv_state``, version 2): in activation dtype, its
axes after the slot in the order of the conv layout."""

_SLOTS = _i32(("B",), "slot")
_QSL = _i32(("B+1",), "qsl")

INPUTS: dict[str, dict[str, Role]] = {
    "verify": {
        "q": Role((1, "Ttot", "H", "K"), "act"),
        "k": Role((1, "Ttot", "H", "K"), "act"),
        "v": Role((1, "Ttot", "H", "V"), "act"),
        "raw_g": Role((1, "Ttot", "H", "K"), "act"),
        "raw_beta": Role((1, "Ttot", "H"), "act"),
        "query_start_loc": _QSL,
        "state_indices": _SLOTS,
        "record_indices": _i32(("B",), "record_row", required=False),
    },
    "plan": {
        "num_accepted": _i32(("B",)),
        "query_start_loc": _QSL,
        "state_indices": _SLOTS,
        "block_table": _i32(("B", "W"), "slot", required=False),
        "num_computed": _i32(("B",), "nonneg", required=False),
    },
    "defer": {
        "state_indices": _SLOTS,
        "record_rows": _i32(("B",), "record_row"),
        "eager": Role(("B",), "flag", required=False),
    },
    "commit": {
        "state_indices": _SLOTS,
        "record_indices": _i32(("B",), "record_row", required=False),
    },
    "flush": {
        "state_indices": _SLOTS,
        "record_rows": _i32(("B",), "record_row"),
    },
    "write": {
        "slots": _i32(("M",), "real_slot", required=False),
        "states": Role(("M", "H", "V", "K"), "state", required=False),
        "rows": _i32(("Q",), "real_record_row", required=False),
        "records.correction": Role(("Q", "H", "T", "V"), "float32", required=False),
        "records.key_gate": Role(("Q", "H", "T", "2K"), "act", required=False),
        **{role: Role(r.shape, r.dtype, False, r.index) for role, r in BUFFERS.items()
           if role not in ("checkpoint_state", "records.correction", "records.key_gate")},
        **{role: Role(r.shape, r.dtype, False) for role, r in PARAMS.items()},
        "conv_slots": _i32(("Mc",), "real_slot", required=False),
        "conv_states": Role(("Mc", "conv1", "conv2"), "act", required=False),
    },
    "commit_layers": {
        "num_accepted": _i32(("Rq",)),
        "state_indices": _SLOTS,
        "query_start_loc": _QSL,
        "request_indices": _i32(("B",), "request", required=False),
        "block_table": _i32(("Rq", "W"), "slot", required=False),
        "num_computed": _i32(("Rq",), "nonneg", required=False),
    },
}
"""What each op reads, by role; the plan buffer is read from the evolving buffers, not here.

write: new contents of buffer regions, set before the next event runs: state ``slots``
       (distinct) and their ``states``; record ``rows`` (distinct) and their records; whole
       pending counts, plan columns and parameters; conv ``conv_slots`` (distinct) and their
       whole ``conv_states`` (a trace with conv state). Each is optional.
commit_layers: the engine's commit of every layer; ``num_accepted`` (and in align mode
       ``block_table`` and ``num_computed``) per request, row b's at ``request_indices[b]``
       (or b: then ``Rq >= B``)."""
WRITE_GROUPS = (("slots", "states"), ("rows", "records.correction", "records.key_gate"),
                ("conv_slots", "conv_states"))
"""Roles of a write that come together: an index tensor and the contents it places."""

_WRITTEN_STATES = {
    "slots": _i32(("M",), "real_slot"),
    "states": Role(("M", "H", "V", "K"), "state"),
}

EXPECTED: dict[str, dict[str, Role]] = {
    "verify": {
        "out": Role((1, "Ttot", "H", "V"), "act"),
        "records.correction": Role(("B", "H", "T", "V"), "float32"),
        "records.key_gate": Role(("B", "H", "T", "2K"), "act"),
    },
    "plan": {name: _i32(("B",)) for name in PLAN_FIELDS},
    "defer": {"pending": _i32(("R",)), "commit_lens": _i32(("B",))},
    "commit": dict(_WRITTEN_STATES),
    "flush": {**_WRITTEN_STATES, "pending": _i32(("R",))},
    "write": {},
    "commit_layers": {
        **_WRITTEN_STATES,
        "states": Role(("L", "M", "H", "V", "K"), "state"),
        "conv_windows": Role(("L", "M", "win1", "win2"), "act"),
    },
}
"""What each op writes, by role. Every expected role is optional.

verify: ``out``; the record rows of batch row b (read at ``record_indices[b]`` or b),
        compared where the row wrote them (real slot, record row >= 0, token t < its length).
plan:   the first B rows of the plan.   defer: all of ``pending``, plan ``commit_lens[:B]``.
commit, flush: ``slots`` (distinct real slots written) and ``states`` (their contents after).
commit_layers: ``slots`` (distinct real slots written), per layer ``states`` and
        ``conv_windows``, each slot's first ``Wh`` conv entries of every channel after the
        commit (``[L, M, D, Wh]`` dim_first, ``[L, M, Wh, D]`` token_first).
"""

ATTRS = {"plan": ("block_size", "layer"), "flush": ("consume_pending", "layer"),
         "commit_layers": ("block_size", "records", "rule"),
         "verify": ("layer", "graph_replay"), **{op: ("layer",) for op in ("defer", "commit", "write")}}
"""Attrs an op may carry. flush ``consume_pending``: whether the flush zeroed the counts it
folded (kda's flush API) or left them (the documented flush plan kernel); absent = true.
commit_layers ``records`` (``COMMIT_RECORDS``): the record row batch row b folds, that of its
slot (``slot``, absent) or row b itself (``batch_row``); ``rule`` (``COMMIT_RULES``): the
engine's align-mode rule, kda's (``kda``, absent) or the released vLLM engine's
(docs/trace-format.md). verify ``graph_replay``: the event is a verify a CUDA graph held, recorded
at the recording's N-th graph replay (N >= 1; ``traces.record.graph_calls``)."""
COMMIT_RECORDS = ("slot", "batch_row")
COMMIT_RULES = ("kda", "vllm-0.33.0")
