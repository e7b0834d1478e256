"""The tensor roles ops read and write: what each buffer, parameter and op input or result
is, by role, with its shape in symbols (``traces.format.schema`` says which), dtype and value
rule, and the roles several ops share. ``traces.format.validate`` checks a trace's tensors
against them."""

from __future__ import annotations

from dataclasses import dataclass

NULL_ID = 0
"""Null state slot; any slot index ``<= NULL_ID`` is null."""
PAD_ID = -1
"""Smallest index a trace may hold: the padding id for slots and the 'no row' id for records."""


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


def int32(shape: tuple[str | int, ...], index: str | None = None, required: bool = True) -> Role:
    """An int32 role."""
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
    "pending": int32(("R",)),
    "plan.commit_lens": int32(("P",), "count"),
    "plan.final_state_indices": int32(("P",), "slot"),
    "plan.boundary_state_indices": int32(("P",), "slot"),
    "plan.boundary_recovery_lens": int32(("P",), "count"),
}
"""Buffers that live across events: the ``initial`` set (required) and ``final`` set (optional)."""
LAYER_BUFFERS = ("checkpoint_state", "records.correction", "records.key_gate", "pending")
"""The buffers each layer has of its own; the plan buffers are shared by all layers."""
SHARED_BUFFERS = tuple(role for role in BUFFERS if role not in LAYER_BUFFERS)
CONV_STATE = Role(("N", "conv1", "conv2"), "act")
"""A layer's conv state pool (role ``conv_state``, version 2): in activation dtype, its
axes after the slot in the order of the conv layout."""

SLOTS = int32(("B",), "slot")
"""A batch's state slots (``state_indices``)."""
QSL = int32(("B+1",), "qsl")
"""A batch's ``query_start_loc``."""
WRITTEN_STATES = {
    "slots": int32(("M",), "real_slot"),
    "states": Role(("M", "H", "V", "K"), "state"),
}
"""The expected results of an op that writes states: ``slots`` (distinct real slots written)
and ``states`` (their contents after)."""
