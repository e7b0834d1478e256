"""Trace format v1: the manifest, its JSON form, and the tensor roles of every op.

A trace is one safetensors file. Its ``__metadata__`` holds the manifest as one JSON
string under the key ``manifest`` (see docs/trace-format.md). Tensor shapes are written
with symbols: ``H K V T`` and ``2K``, ``HK`` (= H*K) come from the manifest, ``N R P`` from
its buffer sizes, and ``Ttot B M W`` are bound per event by the first tensor that uses them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterator

FORMAT_NAME = "kda-trace"
FORMAT_VERSION = 1
METADATA_KEY = "manifest"
NULL_ID = 0
"""Null state slot; any slot index ``<= NULL_ID`` is null."""
PAD_ID = -1
"""Smallest index a trace may hold: the padding id for slots and the 'no row' id for records."""

OPS = ("verify", "plan", "defer", "commit", "flush", "write")
KERNEL_OPS = OPS[:5]
"""The ops that are kernel calls; ``write`` is what changed in the buffers between them."""
FLOAT_DTYPES = ("bfloat16", "float16", "float32", "float64")
ACTIVATION_DTYPES = FLOAT_DTYPES
STATE_DTYPES = ("float32", "bfloat16", "float64")


MAX_JSON_DEPTH = 32
"""Deepest nesting of objects and lists a trace's JSON may hold (the manifest is 4 deep;
free-form provenance gets room): deeper text is refused before it can exhaust the stack."""


class TraceError(Exception):
    """A trace that breaks the format; the message names the event and the tensor."""


def strict_json(text: str | bytes, what: str) -> Any:
    """Parse ``text`` as strict JSON: no NaN or Infinity (literal or overflowing), no key twice
    in one object, at most ``MAX_JSON_DEPTH`` levels. Raises ``TraceError`` naming ``what``."""
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            _expect(key not in out, f"{what}: duplicate key {key!r}")
            out[key] = value
        return out

    def finite(literal: str) -> float:
        value = float(literal)
        _expect(math.isfinite(value), f"{what}: number {literal} is out of range")
        return value

    def constant(literal: str) -> None:
        raise TraceError(f"{what}: {literal} is not JSON")

    try:
        data = json.loads(text, object_pairs_hook=pairs, parse_float=finite, parse_constant=constant)
    except RecursionError:
        raise TraceError(f"{what}: nested more than {MAX_JSON_DEPTH} levels deep") from None
    except ValueError as exc:  # bad syntax or encoding, or an integer of more digits than Python converts
        raise TraceError(f"{what}: not valid JSON ({exc})") from None
    _expect(_depth(data) <= MAX_JSON_DEPTH, f"{what}: nested more than {MAX_JSON_DEPTH} levels deep")
    return data


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _is_int(value: Any) -> bool:
    """A JSON integer: ``true`` and ``false`` are not numbers."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Role:
    """One tensor an op reads or writes.

    shape: symbols or ints (module docstring); ``B+1`` binds B from the length.
    dtype: ``act``, ``state``, ``float32``, ``int32`` or ``flag`` (bool, int8, uint8, int32).
    index: value rule for integer tensors: ``slot`` (PAD_ID <= i < N), ``real_slot``
           (NULL_ID < i < N), ``record_row`` (PAD_ID <= i < R), ``real_record_row``
           (0 <= i < R), ``qsl`` (query_start_loc),
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
    },
}
"""What each op reads, by role; the plan buffer is read from the evolving buffers, not here.

write: new contents of buffer regions, set before the next event runs: state ``slots``
       (distinct) and their ``states``; record ``rows`` (distinct) and their records; whole
       pending counts, plan columns and parameters. Each is optional."""
WRITE_GROUPS = (("slots", "states"), ("rows", "records.correction", "records.key_gate"))
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
}
"""What each op writes, by role. Every expected role is optional.

verify: ``out``; the record rows of batch row b (read at ``record_indices[b]`` or b),
        compared where the row wrote them (real slot, record row >= 0, token t < its length).
plan:   the first B rows of the plan.   defer: all of ``pending``, plan ``commit_lens[:B]``.
commit, flush: ``slots`` (distinct real slots written) and ``states`` (their contents after).
"""

ATTRS = {"plan": ("block_size",), "flush": ("consume_pending",)}
"""Attrs an op may carry. flush ``consume_pending``: whether the flush zeroed the counts it
folded (kda's flush API) or left them (the documented flush plan kernel); absent = true."""


@dataclass(frozen=True)
class Dims:
    H: int
    K: int
    V: int
    T: int


@dataclass(frozen=True)
class BufferSizes:
    num_slots: int
    num_record_rows: int
    plan_rows: int


@dataclass
class Event:
    """One op call: its inputs and (optional) expected results, role -> tensor name."""

    op: str
    inputs: dict[str, str]
    expected: dict[str, str] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "inputs": dict(self.inputs), "expected": dict(self.expected), "attrs": dict(self.attrs)}


@dataclass
class Manifest:
    """Everything in a trace but the tensors. ``initial`` and ``final`` map buffer roles
    (``BUFFERS``) to tensor names; ``final`` may be empty."""

    dims: Dims
    activation_dtype: str
    state_dtype: str
    lower_bound: float | None
    sizes: BufferSizes
    params: dict[str, str]
    initial: dict[str, str]
    final: dict[str, str] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    provenance: dict[str, Any] = field(default_factory=dict)
    null_id: int = NULL_ID

    def to_json(self) -> str:
        return json.dumps({
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "dims": {"H": self.dims.H, "K": self.dims.K, "V": self.dims.V, "T": self.dims.T},
            "dtypes": {"activation": self.activation_dtype, "state": self.state_dtype},
            "lower_bound": self.lower_bound,
            "null_id": self.null_id,
            "buffers": {"num_slots": self.sizes.num_slots, "num_record_rows": self.sizes.num_record_rows,
                        "plan_rows": self.sizes.plan_rows},
            "params": self.params,
            "initial": self.initial,
            "final": self.final,
            "events": [e.to_json() for e in self.events],
            "provenance": self.provenance,
        })

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        """Parse and check the manifest's structure (not the tensors); raise ``TraceError``."""
        data = strict_json(text, "manifest")
        _expect(isinstance(data, dict), "manifest: expected a JSON object")
        fmt, version = data.get("format"), data.get("version")
        _expect(fmt == FORMAT_NAME, f"manifest: format is {fmt!r}, expected {FORMAT_NAME!r}")
        _expect(_is_int(version) and version == FORMAT_VERSION,
                f"manifest: format version {version!r} is not supported (this kda reads version {FORMAT_VERSION})")
        dims = _section(data, "dims")
        dtypes = _section(data, "dtypes")
        buffers = _section(data, "buffers")
        d = Dims(*(_positive_int(dims, key, "dims") for key in ("H", "K", "V", "T")))
        act = dtypes.get("activation")
        state = dtypes.get("state")
        _expect(act in ACTIVATION_DTYPES, f"manifest: dtypes.activation {act!r} is not one of {ACTIVATION_DTYPES}")
        _expect(state in STATE_DTYPES, f"manifest: dtypes.state {state!r} is not one of {STATE_DTYPES}")
        lower_bound = data.get("lower_bound")
        finite = isinstance(lower_bound, float) or (_is_int(lower_bound) and abs(lower_bound) < 2**53)
        _expect(lower_bound is None or finite,
                f"manifest: lower_bound must be a finite number or null, got {lower_bound!r}")
        null_id = data.get("null_id")
        _expect(_is_int(null_id) and null_id == NULL_ID,
                f"manifest: null_id {null_id!r} is not supported (version 1 uses {NULL_ID})")
        sizes = BufferSizes(*(_positive_int(buffers, key, "buffers")
                              for key in ("num_slots", "num_record_rows", "plan_rows")))
        params = _names(data, "params", PARAMS, all_required=True)
        initial = _names(data, "initial", BUFFERS, all_required=True)
        final = _names(data, "final", BUFFERS, all_required=False)
        _expect(not final or set(final) == set(BUFFERS),
                f"manifest: final names {sorted(final)}, expected none or all of {sorted(BUFFERS)}")
        raw_events = data.get("events")
        _expect(isinstance(raw_events, list), "manifest: events must be a list")
        events = [_event(i, e) for i, e in enumerate(raw_events)]
        provenance = data.get("provenance", {})
        _expect(isinstance(provenance, dict), "manifest: provenance must be an object")
        return cls(d, act, state, None if lower_bound is None else float(lower_bound), sizes, params, initial,
                   final, events, provenance, null_id)

    def named_tensors(self) -> Iterator[tuple[str, str]]:
        """``(where, tensor name)`` for every tensor the manifest names, ``where`` being
        ``params.A_log``, ``initial.pending``, ``event 3 inputs.state_indices`` and so on."""
        for section in ("params", "initial", "final"):
            for role, name in getattr(self, section).items():
                yield f"{section}.{role}", name
        for i, event in enumerate(self.events):
            for section in ("inputs", "expected"):
                for role, name in getattr(event, section).items():
                    yield f"event {i} ({event.op}) {section}.{role}", name


def check_one_role_per_tensor(manifest: Manifest) -> None:
    """Every role gets a tensor of its own: a name used twice would make two buffers (or a
    buffer and an input) share memory at run time. Raises ``TraceError``."""
    seen: dict[str, str] = {}
    for where, name in manifest.named_tensors():
        _expect(name not in seen, f"manifest: tensor {name!r} is named for two roles ({seen.get(name)} and {where}); "
                                  "every role needs a tensor of its own")
        seen[name] = where


def _expect(cond: bool, message: str) -> None:
    if not cond:
        raise TraceError(message)


def _section(data: dict, key: str) -> dict:
    value = data.get(key)
    _expect(isinstance(value, dict), f"manifest: missing or malformed '{key}' section")
    return value


def _positive_int(section: dict, key: str, where: str) -> int:
    value = section.get(key)
    _expect(_is_int(value) and value >= 1,
            f"manifest: {where}.{key} must be a positive integer, got {value!r}")
    return value


def _names(data: dict, key: str, roles: dict[str, Role], all_required: bool) -> dict[str, str]:
    names = data.get(key, {} if not all_required else None)
    _expect(isinstance(names, dict), f"manifest: missing or malformed '{key}' section")
    for role, name in names.items():
        _expect(role in roles, f"manifest: {key}.{role} is not a known role ({', '.join(roles)})")
        _expect(isinstance(name, str) and name, f"manifest: {key}.{role} must name a tensor")
    if all_required:
        missing = [r for r in roles if r not in names]
        _expect(not missing, f"manifest: {key} lacks {', '.join(missing)}")
    return dict(names)


def _event(index: int, raw: Any) -> Event:
    where = f"event {index}"
    _expect(isinstance(raw, dict), f"{where}: expected a JSON object")
    op = raw.get("op")
    _expect(op in OPS, f"{where}: op {op!r} is not one of {', '.join(OPS)}")
    inputs, expected, attrs = raw.get("inputs"), raw.get("expected", {}), raw.get("attrs", {})
    for section, value, roles in (("inputs", inputs, INPUTS[op]), ("expected", expected, EXPECTED[op])):
        _expect(isinstance(value, dict), f"{where} ({op}): '{section}' must be an object")
        for role, name in value.items():
            _expect(role in roles, f"{where} ({op}): {section}.{role} is not a role of {op} ({', '.join(roles)})")
            _expect(isinstance(name, str) and name, f"{where} ({op}): {section}.{role} must name a tensor")
    missing = [r for r, spec in INPUTS[op].items() if spec.required and r not in inputs]
    _expect(not missing, f"{where} ({op}): inputs lack {', '.join(missing)}")
    _expect(isinstance(attrs, dict), f"{where} ({op}): 'attrs' must be an object")
    unknown = [a for a in attrs if a not in ATTRS.get(op, ())]
    _expect(not unknown, f"{where} ({op}): unknown attrs {', '.join(unknown)}")
    _expect(isinstance(attrs.get("consume_pending", True), bool),
            f"{where} ({op}): attrs.consume_pending must be true or false, got {attrs.get('consume_pending')!r}")
    for group in WRITE_GROUPS if op == "write" else ():
        present = [role for role in group if role in inputs]
        _expect(len(present) in (0, len(group)), f"{where} ({op}): inputs {', '.join(group)} come together")
    _expect(op != "write" or inputs, f"{where} ({op}): a write names no tensor")
    return Event(op, dict(inputs), dict(expected), dict(attrs))
