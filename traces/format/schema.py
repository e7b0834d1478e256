"""Trace format v2 (v1 still read): the manifest, its JSON form, and the tensor roles of every op.

A trace is one safetensors file. Its ``__metadata__`` holds the manifest as one JSON
string under the key ``manifest`` (see docs/trace-format.md). Tensor shapes are written
with symbols: ``H K V T`` and ``2K``, ``HK`` (= H*K) come from the manifest, ``N R P`` from
its buffer sizes, ``L`` (layers), ``D`` (conv channels), ``S`` (conv entries) and ``Wh``
(conv history, W - 1) from its layers and conv state, ``conv1 conv2`` (the conv pool's axes
1 and 2) and ``win1 win2`` (a conv window's) from the conv layout, and ``Ttot B M W Rq``
are bound per event by the first tensor that uses them.

Version 2 holds several KDA layers (each its own parameters and buffers, optionally a conv
state pool) and one shared plan; version 1 is a trace of one layer without conv state.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterator

from traces.ops import table
from traces.ops.roles import (  # noqa: F401  (the roles are part of the schema's names)
    BUFFERS, CONV_STATE, LAYER_BUFFERS, NULL_ID, PAD_ID, PARAMS, PLAN_FIELDS, SHARED_BUFFERS, Role,
)
from traces.ops.table import KERNEL_OPS, LAYER_OPS  # noqa: F401

FORMAT_NAME = "kda-trace"
SUFFIX = ".safetensors"
"""How a trace file's name ends: a corpus folder is scanned for ``*.safetensors``, and the
commands that write a trace refuse another name."""
FORMAT_VERSION = 2
"""The version written for a trace of several layers or with conv state; others are written
as version 1 (``Manifest.version``)."""
READ_VERSIONS = (1, 2)
METADATA_KEY = "manifest"

OPS = tuple(table.OPS)
"""The ops a trace may hold (``traces.ops``): ``KERNEL_OPS`` are kernel calls, ``LAYER_OPS``
run on one layer's buffers."""
INPUTS = {name: dict(op.inputs) for name, op in table.OPS.items()}
"""What each op reads, by role; the plan buffer is read from the evolving buffers, not here."""
EXPECTED = {name: dict(op.expected) for name, op in table.OPS.items()}
"""What each op writes, by role. Every expected role is optional."""
ATTRS = {name: op.attrs for name, op in table.OPS.items()}
"""Attrs an op may carry."""
CONV_LAYOUTS = ("dim_first", "token_first")
"""Conv state pools: ``dim_first`` is ``[N, D, S]``, ``token_first`` ``[N, S, D]``."""
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


@dataclass(frozen=True)
class ConvSpec:
    """The layers' conv state (version 2): ``layout`` (``CONV_LAYOUTS``), ``dim`` channels
    (D) and convolution ``width`` W >= 2; a slot holds ``S = W - 1 + T - 1`` entries a channel."""

    layout: str
    dim: int
    width: int

    def to_json(self) -> dict[str, Any]:
        return {"layout": self.layout, "dim": self.dim, "width": self.width}


@dataclass
class LayerNames:
    """One layer's tensors beyond the first layer's: ``params`` and ``initial`` / ``final``
    (``final`` may be empty) map roles to tensor names; buffers are ``LAYER_BUFFERS`` and,
    with conv state, ``conv_state``."""

    params: dict[str, str] = field(default_factory=dict)
    initial: dict[str, str] = field(default_factory=dict)
    final: dict[str, str] = field(default_factory=dict)


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
    """Everything in a trace but the tensors. ``params``, ``initial`` and ``final`` are the
    first layer's (and ``initial``/``final`` the shared plan's too): they map roles
    (``BUFFERS``, and ``conv_state`` with ``conv``) to tensor names; ``final`` may be empty.
    ``further_layers`` names layers 1.. (version 2); ``conv`` describes the conv state."""

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
    further_layers: list[LayerNames] = field(default_factory=list)
    conv: ConvSpec | None = None

    @property
    def version(self) -> int:
        """2 for several layers or conv state, else 1."""
        return FORMAT_VERSION if self.further_layers or self.conv is not None else 1

    @property
    def num_layers(self) -> int:
        return 1 + len(self.further_layers)

    def layer(self, index: int) -> LayerNames:
        """Layer ``index``'s own names (for layer 0 without the shared plan's)."""
        if index == 0:
            return LayerNames(dict(self.params), {r: n for r, n in self.initial.items() if r not in SHARED_BUFFERS},
                              {r: n for r, n in self.final.items() if r not in SHARED_BUFFERS})
        return self.further_layers[index - 1]

    def shared(self, section: str) -> dict[str, str]:
        """The shared plan's names in ``initial`` or ``final``."""
        return {r: n for r, n in getattr(self, section).items() if r in SHARED_BUFFERS}

    def buffer_roles(self) -> tuple[str, ...]:
        """A layer's buffer roles: ``LAYER_BUFFERS``, and ``conv_state`` with conv state."""
        return LAYER_BUFFERS + (("conv_state",) if self.conv is not None else ())

    def to_json(self) -> str:
        if self.version == 1:
            body = {"params": self.params, "initial": self.initial, "final": self.final}
        else:
            layers = [self.layer(i) for i in range(self.num_layers)]
            body = {**({"conv": self.conv.to_json()} if self.conv is not None else {}),
                    "layers": [{"params": x.params, "initial": x.initial, "final": x.final} for x in layers],
                    "initial": self.shared("initial"), "final": self.shared("final")}
        return json.dumps({
            "format": FORMAT_NAME,
            "version": self.version,
            "dims": {"H": self.dims.H, "K": self.dims.K, "V": self.dims.V, "T": self.dims.T},
            "dtypes": {"activation": self.activation_dtype, "state": self.state_dtype},
            "lower_bound": self.lower_bound,
            "null_id": self.null_id,
            "buffers": {"num_slots": self.sizes.num_slots, "num_record_rows": self.sizes.num_record_rows,
                        "plan_rows": self.sizes.plan_rows},
            **body,
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
        _expect(_is_int(version) and version in READ_VERSIONS,
                f"manifest: format version {version!r} is not supported (this kda reads versions "
                f"{', '.join(map(str, READ_VERSIONS))})")
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
        if version == 1:
            _expect("layers" not in data and "conv" not in data,
                    "manifest: layers and conv are version 2 fields; this manifest says version 1")
            conv, layers = None, [LayerNames(_names(data, "params", PARAMS, all_required=True),
                                             _names(data, "initial", BUFFERS, all_required=True),
                                             _names(data, "final", BUFFERS, all_required=False))]
            initial, final = layers[0].initial, layers[0].final
            _expect(not final or set(final) == set(BUFFERS),
                    f"manifest: final names {sorted(final)}, expected none or all of {sorted(BUFFERS)}")
        else:
            conv = _conv(data)
            layers = _layers(data, conv)
            shared = {role: BUFFERS[role] for role in SHARED_BUFFERS}
            initial = {**layers[0].initial, **_names(data, "initial", shared, all_required=True)}
            final = _names(data, "final", shared, all_required=False)
            has_final = {bool(final), *(bool(x.final) for x in layers)}
            _expect(len(has_final) == 1, "manifest: final names the buffers of some layers or of the plan but not "
                                         "of all; expected none or all")
            final = {**layers[0].final, **final}
        raw_events = data.get("events")
        _expect(isinstance(raw_events, list), "manifest: events must be a list")
        events = [_event(i, e, len(layers)) for i, e in enumerate(raw_events)]
        provenance = data.get("provenance", {})
        _expect(isinstance(provenance, dict), "manifest: provenance must be an object")
        return cls(d, act, state, None if lower_bound is None else float(lower_bound), sizes, layers[0].params,
                   initial, final, events, provenance, null_id, layers[1:], conv)

    def named_tensors(self) -> Iterator[tuple[str, str]]:
        """``(where, tensor name)`` for every tensor the manifest names, ``where`` being
        ``params.A_log``, ``initial.pending``, ``event 3 inputs.state_indices`` and so on."""
        for section in ("params", "initial", "final"):
            for role, name in getattr(self, section).items():
                yield f"{section}.{role}", name
        for i, layer in enumerate(self.further_layers, start=1):
            for section in ("params", "initial", "final"):
                for role, name in getattr(layer, section).items():
                    yield f"layers[{i}].{section}.{role}", name
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


def _names(data: dict, key: str, roles: dict[str, Role], all_required: bool, where: str = "") -> dict[str, str]:
    key_at = f"{where}.{key}" if where else key
    names = data.get(key, {} if not all_required else None)
    _expect(isinstance(names, dict), f"manifest: missing or malformed '{key_at}' section")
    for role, name in names.items():
        _expect(role in roles, f"manifest: {key_at}.{role} is not a known role ({', '.join(roles)})")
        _expect(isinstance(name, str) and name, f"manifest: {key_at}.{role} must name a tensor")
    if all_required:
        missing = [r for r in roles if r not in names]
        _expect(not missing, f"manifest: {key_at} lacks {', '.join(missing)}")
    return dict(names)


def _conv(data: dict) -> ConvSpec | None:
    """The ``conv`` section of a version 2 manifest, or None when absent."""
    if "conv" not in data:
        return None
    conv = _section(data, "conv")
    unknown = sorted(set(conv) - {"layout", "dim", "width"})
    _expect(not unknown, f"manifest: conv.{unknown[0] if unknown else ''} is not a conv field (layout, dim, width)")
    layout = conv.get("layout")
    _expect(layout in CONV_LAYOUTS, f"manifest: conv.layout {layout!r} is not one of {', '.join(CONV_LAYOUTS)}")
    width = _positive_int(conv, "width", "conv")
    _expect(width >= 2, f"manifest: conv.width must be at least 2 (a history of W - 1 >= 1 inputs), got {width}")
    return ConvSpec(layout, _positive_int(conv, "dim", "conv"), width)


def _layers(data: dict, conv: ConvSpec | None) -> list[LayerNames]:
    """The ``layers`` list of a version 2 manifest: each layer's params, initial and final."""
    raw = data.get("layers")
    _expect(isinstance(raw, list) and raw, "manifest: layers must be a non-empty list")
    roles = {role: BUFFERS[role] for role in LAYER_BUFFERS}
    if conv is not None:
        roles["conv_state"] = CONV_STATE
    layers = []
    for i, layer in enumerate(raw):
        where = f"layers[{i}]"
        _expect(isinstance(layer, dict), f"manifest: {where} must be an object")
        unknown = sorted(set(layer) - {"params", "initial", "final"})
        _expect(not unknown, f"manifest: {where}.{unknown[0] if unknown else ''} is not a layer field "
                             "(params, initial, final)")
        names = LayerNames(_names(layer, "params", PARAMS, all_required=True, where=where),
                           _names(layer, "initial", roles, all_required=True, where=where),
                           _names(layer, "final", roles, all_required=False, where=where))
        _expect(not names.final or set(names.final) == set(roles),
                f"manifest: {where}.final names {sorted(names.final)}, expected none or all of {sorted(roles)}")
        layers.append(names)
    return layers


def _event(index: int, raw: Any, num_layers: int = 1) -> Event:
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
    layer = attrs.get("layer", 0)
    _expect(_is_int(layer) and 0 <= layer < num_layers,
            f"{where} ({op}): attrs.layer must be a layer index in [0, {num_layers - 1}], got {layer!r}")
    spec = table.OPS[op]
    for attr in spec.counts:
        _expect(_is_int(attrs.get(attr, 1)) and attrs.get(attr, 1) >= 1,
                f"{where} ({op}): attrs.{attr} must be a count >= 1, got {attrs.get(attr)!r}")
    for attr in spec.flags:
        _expect(isinstance(attrs.get(attr, True), bool),
                f"{where} ({op}): attrs.{attr} must be true or false, got {attrs.get(attr)!r}")
    for attr, values in spec.choices.items():
        _expect(attrs.get(attr, values[0]) in values,
                f"{where} ({op}): attrs.{attr} must be one of {', '.join(values)}, got {attrs.get(attr)!r}")
    for group in spec.groups:
        present = [role for role in group if role in inputs]
        _expect(len(present) in (0, len(group)), f"{where} ({op}): inputs {', '.join(group)} come together")
    _expect(spec.empty_inputs is None or inputs, f"{where} ({op}): {spec.empty_inputs}")
    placed = [role for role in ("states", "conv_windows") if role in expected]
    _expect(not placed or "slots" in expected,
            f"{where} ({op}): expected {', '.join(placed)} without the slots they hold (expected.slots)")
    return Event(op, dict(inputs), dict(expected), dict(attrs))
