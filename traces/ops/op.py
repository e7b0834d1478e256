"""What the table knows of one op (``Op``), and what a replay hands an op to compare its
results (``Outcome``). Torch-free: the format's schema reads the table before any heavy
import, so an op module imports torch only inside the functions that run it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from traces.ops.roles import Role

Thunk = Callable[[], Any]
Located = tuple[Any, Any, Callable[[tuple[int, ...]], dict[str, Any]]]
"""An op's result for one role as a replay holds it, the mask of elements compared (None:
all) and a function from an index of it to named coordinates."""


@dataclass
class Outcome:
    """What one event left on a replay's buffers, for comparing with its expected results.

    ``inputs``: its inputs by role, on the CPU; ``slots`` and ``rows``: its state slots and
    record rows (``record_rows``, ``record_indices`` or the batch row), int64; ``bufs``: the
    buffers of the layer it ran on; ``layers`` and ``layer_numbers``: the compared layers'
    buffers and numbers (an op of every layer); ``out``: a verify's output; ``written()``: the
    slots its expected ``slots`` names and a function from a slot to the first batch row whose
    plan sends a fold there (None if none)."""

    inputs: Mapping[str, Any]
    slots: Any
    rows: Any
    bufs: Any
    layers: list[Any]
    layer_numbers: list[int]
    out: Any
    T: int
    K: int
    conv: Any
    written: Callable[[], tuple[Any, Callable[[int], int | None]]]


def default_record_rows(inputs: Mapping[str, Any], attrs: Mapping[str, Any]) -> str | None:
    """Why an op with an optional ``record_indices`` input uses a record row per batch row
    (batch row b's is b), or None when it names them."""
    return None if "record_indices" in inputs else "without record_indices"


def no_record_rows(inputs: Mapping[str, Any], attrs: Mapping[str, Any]) -> None:
    """An op that uses no record row of its own per batch row."""
    return None


@dataclass(frozen=True)
class Op:
    """One op of the trace format, everything the tools know of it.

    name, inputs, expected, attrs: its name in a trace, the roles it reads and writes
    (``traces.ops.roles``), the attrs it may carry.
    order: its place in the table (``traces.ops.table``), where the format lists its ops.
    api: the kernel API function that runs it (None: not a kernel call).
    per_layer: runs on one layer's buffers, named by attr ``layer`` (False: on every layer).
    call(api, x, attrs, target, T, lower_bound, out): its call through ``api``, ready to run
        (and to run again), returning what the op returns; ``x``: its inputs by role on the
        device; ``target``: the layer's buffers (``traces.replay.buffers.Buffers``) or, for an
        op of every layer, the commit contexts (``traces.replay.commit_context.CommitContexts``);
        ``out``: verify's output (None: the op allocates it).
    out_like: the input role whose shape and dtype the output a replay hands ``call`` takes
        (None: the op takes no output).
    apply_expected(e, x, target, T, conv): overwrite the buffer regions its expected results
        ``e`` describe with them (``target``: the layer's buffers, or every layer's).
    actual(role, outcome): what a replay holds for an expected ``role`` (``Located``).
    written(x, attrs, returned, target, conv): what it wrote (its expected roles), read back
        from ``target`` (as for ``apply_expected``) right after it ran and returned ``returned``,
        as ``kda record`` records it.
    plan_rows: its batch rows are plan rows, so a batch fits the plan (every op but verify).
    tokens: its inputs hold per-token activations, cut with its batch rows (verify).
    row_space: how ``traces.repro.slice`` groups it: ``own`` (a row space of its own),
        ``opens`` (writes plan rows that the events after it read), ``joins`` the current
        one, or None (no batch rows).
    reads_plan: reads the plan rows written before it (a row space it starts reads the
        initial plan).
    align: takes align mode (``block_table``, ``num_computed``, attr ``block_size``).
    record_rows(inputs, attrs): why it uses one record row per batch row (None: it does not).
    distinct: index inputs whose values must be distinct; groups: inputs that come together;
    empty_inputs: the error when it names no input (None: allowed).
    needs_conv: needs the trace's conv state.
    flags, choices, counts: attrs that are true or false, attrs with their allowed values
        (the first is the default), and attrs that count from 1.
    check_buffers(attrs, sizes), check_batch(inputs, bound, batch): its own checks of the
        trace's buffer sizes and of its bound symbols; each returns an error or None.
    event_bytes(s, T, x, plan, pending): contract bytes of one event and the tokens it folds
        (``traces.bench.contract_bytes.event_bytes``); None: not timed.
    workload_bytes(s, batch, spec_len, commit_lens): contract bytes of one call of the bench's
        workload (``traces.bench.contract_bytes.op_bytes``).
    folds: folds records into state (its folded tokens count).
    cost_weight: interpreter cost of a batch row, relative to verify's (None: a small op;
        ``traces.replay.cost``).
    """

    name: str
    inputs: Mapping[str, Role]
    expected: Mapping[str, Role]
    attrs: tuple[str, ...]
    call: Callable[..., Thunk]
    apply_expected: Callable[..., None]
    actual: Callable[[str, Outcome], Located] | None = None
    written: Callable[..., dict[str, Any]] | None = None
    api: str | None = None
    out_like: str | None = None
    per_layer: bool = True
    plan_rows: bool = True
    tokens: bool = False
    row_space: str | None = "joins"
    reads_plan: bool = False
    align: bool = False
    record_rows: Callable[[Mapping[str, Any], Mapping[str, Any]], str | None] = no_record_rows
    distinct: tuple[str, ...] = ()
    groups: tuple[tuple[str, ...], ...] = ()
    empty_inputs: str | None = None
    needs_conv: bool = False
    flags: tuple[str, ...] = ()
    counts: tuple[str, ...] = ()
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    check_buffers: Callable[[Mapping[str, Any], Any], str | None] | None = None
    check_batch: Callable[[Mapping[str, Any], Mapping[str, int], int], str | None] | None = None
    event_bytes: Callable[..., tuple[int, int]] | None = None
    workload_bytes: Callable[..., int] | None = None
    folds: bool = False
    cost_weight: float | None = None
    order: int = 0
