"""Validation of a whole trace before any kernel runs.

``validate_trace(manifest, source)`` checks every named tensor's presence, shape and
dtype from metadata alone, and loads only the integer tensors to check their values:
slot and record-row ranges, ``query_start_loc`` and counts. An out-of-range index can
therefore never reach a kernel. Every failure is a ``TraceError`` naming event and tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol

import torch

from traces.format.schema import (
    BUFFERS, CONV_STATE, NULL_ID, PAD_ID, PARAMS, Event, Manifest, Role, TraceError, check_one_role_per_tensor,
)
from traces.ops.table import OPS

DTYPE_NAMES = {
    torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32", torch.float64: "float64",
    torch.int32: "int32", torch.int64: "int64", torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8",
    torch.bool: "bool",
}
TORCH_DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}
"""The manifest's dtype names -> torch dtypes."""
FLAG_DTYPES = ("bool", "int8", "uint8", "int32")
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    dtype: str


class TensorSource(Protocol):
    """Where tensors come from: a file being read or a dict being written."""

    def meta(self, name: str) -> TensorMeta | None:
        """Shape and dtype name of ``name``, or None when absent."""

    def load(self, name: str) -> torch.Tensor:
        """The tensor itself, on the CPU."""


class DictSource:
    """A ``TensorSource`` over an in-memory ``{name: tensor}`` mapping."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]):
        self.tensors = tensors

    def meta(self, name: str) -> TensorMeta | None:
        t = self.tensors.get(name)
        if t is None:
            return None
        return TensorMeta(tuple(t.shape), dtype_name(t.dtype))

    def load(self, name: str) -> torch.Tensor:
        return self.tensors[name].detach().cpu()


def validate_trace(manifest: Manifest, source: TensorSource) -> None:
    """Check every tensor the manifest names against the format; raise ``TraceError``."""
    _Checker(manifest, source).run()


def dtype_name(dtype: torch.dtype) -> str:
    """The manifest's name of a torch dtype (``torch.bfloat16`` -> ``"bfloat16"``)."""
    return DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


class _Checker:
    def __init__(self, manifest: Manifest, source: TensorSource):
        m = manifest
        self.m = m
        self.source = source
        d, s = m.dims, m.sizes
        self.fixed = {"H": d.H, "K": d.K, "V": d.V, "T": d.T, "2K": 2 * d.K, "HK": d.H * d.K,
                      "N": s.num_slots, "R": s.num_record_rows, "P": s.plan_rows, "L": m.num_layers}
        if m.conv is not None:
            D, S, Wh = m.conv.dim, m.conv.width - 1 + d.T - 1, m.conv.width - 1
            dim_first = m.conv.layout == "dim_first"
            self.fixed.update({"D": D, "S": S, "Wh": Wh, "conv1": D if dim_first else S,
                               "conv2": S if dim_first else D, "win1": D if dim_first else Wh,
                               "win2": Wh if dim_first else D})

    def run(self) -> None:
        check_one_role_per_tensor(self.m)
        roles = {**PARAMS, **BUFFERS, "conv_state": CONV_STATE}
        for section in ("params", "initial", "final"):
            for role, name in getattr(self.m, section).items():
                self.check(section, role, name, roles[role], {})
        for i, layer in enumerate(self.m.further_layers, start=1):
            for section in ("params", "initial", "final"):
                for role, name in getattr(layer, section).items():
                    self.check(f"layers[{i}].{section}", role, name, roles[role], {})
        for i, event in enumerate(self.m.events):
            self.check_event(i, event)

    def check_event(self, i: int, event: Event) -> None:
        where = f"event {i} ({event.op})"
        op = OPS[event.op]
        bound: dict[str, int] = {}
        conv_roles = {"conv_slots", "conv_states", "conv_windows"} & {*event.inputs, *event.expected}
        if self.m.conv is None and (conv_roles or op.needs_conv):
            what = event.op if op.needs_conv else sorted(conv_roles)[0]
            raise TraceError(f"{where}: {what} needs conv state; the trace has none (no 'conv' section)")
        problem = op.check_buffers(event.attrs, self.m.sizes) if op.check_buffers else None
        if problem:
            raise TraceError(f"{where}: {problem}")
        for section, roles in (("inputs", op.inputs), ("expected", op.expected)):
            names = getattr(event, section)
            for role, spec in roles.items():
                if role in names:
                    self.check(where, role, names[role], spec, bound)
        batch = bound.get("B", 0)
        if op.plan_rows and batch > self.m.sizes.plan_rows:
            raise TraceError(f"{where}: batch of {batch} rows exceeds the plan's {self.m.sizes.plan_rows} rows")
        why = op.record_rows(event.inputs, event.attrs)
        if why and batch > self.m.sizes.num_record_rows:
            raise TraceError(f"{where}: {why}, {batch} rows need {batch} record rows, "
                             f"the trace has {self.m.sizes.num_record_rows}")
        lane = bound.get("Ttot", 0) * self.m.dims.H * max(self.m.dims.K, self.m.dims.V)
        if lane > INT32_MAX:  # the kernels offset tokens in int32
            raise TraceError(f"{where}: {bound['Ttot']} tokens of H*max(K, V) = {lane // bound['Ttot']} elements "
                             f"exceed {INT32_MAX} elements a tensor")
        problem = op.check_batch(event.inputs, bound, batch) if op.check_batch else None
        if problem:
            raise TraceError(f"{where}: {problem}")
        if op.align:
            self.check_align(where, event, bound)
        self.check_distinct(where, event, op.distinct)

    def check_distinct(self, where: str, event: Event, roles: tuple[str, ...]) -> None:
        """Each of an event's index inputs ``roles`` names a slot or record row once (a write's:
        two contents for one would leave the result to the order of the copy)."""
        for role in roles:
            if role in event.inputs:
                name = event.inputs[role]
                v = self.source.load(name).to(torch.int64).reshape(-1)
                values, counts = torch.unique(v, return_counts=True)
                if (counts > 1).any():
                    twice = int(values[counts > 1][0])
                    raise TraceError(f"{where}: tensor '{name}' ({role}): {twice} appears more than once")

    def check_align(self, where: str, event: Event, bound: dict[str, int]) -> None:
        """Align mode: the plan reads block-table columns it derives from ``num_computed``
        and ``block_size``; they stay in range when the table has a column and
        ``num_computed + block_size`` fits in int32 (so do ``num_computed + T`` and the next
        block boundary)."""
        align = ("block_table" in event.inputs, "num_computed" in event.inputs, "block_size" in event.attrs)
        if any(align) and not all(align):
            raise TraceError(f"{where}: align mode needs block_table, num_computed and attrs.block_size together")
        if not all(align):
            return
        bs = event.attrs["block_size"]
        if not isinstance(bs, int) or isinstance(bs, bool) or not self.m.dims.T <= bs <= INT32_MAX:
            raise TraceError(f"{where}: attrs.block_size must be an int in [T = {self.m.dims.T}, {INT32_MAX}], "
                             f"got {bs!r}")
        if bound.get("W") == 0:
            raise TraceError(f"{where}: tensor '{event.inputs['block_table']}' (block_table) has width 0; "
                             "align mode needs at least one column")
        name = event.inputs["num_computed"]
        computed = self.source.load(name).to(torch.int64).reshape(-1)
        if computed.numel() and int(computed.max()) > INT32_MAX - bs:
            at = int(computed.argmax())
            raise TraceError(f"{where}: tensor '{name}' (num_computed): {int(computed[at])} at position {at} is out of "
                             f"range (must be in [0, {INT32_MAX - bs}]: num_computed + block_size must fit in int32)")

    def check(self, where: str, role: str, name: str, spec: Role, bound: dict[str, int]) -> None:
        label = f"{where}: tensor '{name}' ({role})"
        meta = self.source.meta(name)
        if meta is None:
            raise TraceError(f"{label}: missing from the file")
        want = self.dtype_for(spec.dtype)
        if meta.dtype not in want:
            extra = ""
            if meta.dtype in ("float16", "bfloat16", "float32", "float64") and spec.index is not None:
                if torch.isnan(self.source.load(name)).any():
                    extra = " (and it holds NaN)"
            raise TraceError(f"{label}: dtype {meta.dtype}, expected {' or '.join(want)}{extra}")
        self.check_shape(label, meta.shape, spec.shape, bound)
        if spec.index is not None:
            self.check_values(label, self.source.load(name), spec.index, bound)

    def dtype_for(self, symbol: str) -> tuple[str, ...]:
        if symbol == "act":
            return (self.m.activation_dtype,)
        if symbol == "state":
            return (self.m.state_dtype,)
        if symbol == "flag":
            return FLAG_DTYPES
        return (symbol,)

    def check_shape(self, label: str, shape: tuple[int, ...], symbols: tuple, bound: dict[str, int]) -> None:
        expected = []
        ok = len(shape) == len(symbols)
        for size, sym in zip(shape, symbols):
            if isinstance(sym, int):
                want = sym
            elif sym == "B+1":
                if "B" not in bound:
                    bound["B"] = size - 1
                want = bound["B"] + 1
            elif sym in self.fixed:
                want = self.fixed[sym]
            else:
                bound.setdefault(sym, size)
                want = bound[sym]
            expected.append(want)
            ok = ok and size == want
        if not ok or bound.get("B", 0) < 0:
            spelled = ", ".join(f"{s}={w}" if isinstance(s, str) else str(w) for s, w in zip(symbols, expected))
            raise TraceError(f"{label}: shape {list(shape)}, expected [{spelled}]")

    def check_values(self, label: str, t: torch.Tensor, rule: str, bound: dict[str, int]) -> None:
        v = t.to(torch.int64).reshape(-1)
        if v.numel() == 0:
            if rule == "qsl":
                raise TraceError(f"{label}: query_start_loc needs at least one element")
            return
        n, r, T = self.fixed["N"], self.fixed["R"], self.fixed["T"]
        ranges = {"slot": (PAD_ID, n - 1, "slot"), "real_slot": (NULL_ID + 1, n - 1, "written slot"),
                  "record_row": (PAD_ID, r - 1, "record row"), "real_record_row": (0, r - 1, "record row"),
                  "request": (0, bound.get("Rq", 0) - 1, "request index"),
                  "count": (0, T, "count"),
                  "nonneg": (0, None, "value")}
        if rule in ranges:
            lo, hi, what = ranges[rule]
            bad = (v < lo) if hi is None else (v < lo) | (v > hi)
            if bad.any():
                at = int(bad.nonzero()[0, 0])
                span = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
                raise TraceError(f"{label}: {what} {int(v[at])} at position {at} is out of range (must be {span})")
            return
        # query_start_loc: starts at 0, never decreases, at most T tokens a row, ends at T_tot.
        if int(v[0]) != 0:
            raise TraceError(f"{label}: query_start_loc must start at 0, got {int(v[0])}")
        lens = v[1:] - v[:-1]
        if (lens < 0).any():
            at = int((lens < 0).nonzero()[0, 0])
            raise TraceError(f"{label}: query_start_loc is not monotone (row {at}: {int(v[at])} -> {int(v[at + 1])})")
        if (lens > T).any():
            at = int((lens > T).nonzero()[0, 0])
            raise TraceError(f"{label}: row {at} has {int(lens[at])} tokens, more than T = {T}")
        if "Ttot" in bound and int(v[-1]) != bound["Ttot"]:
            raise TraceError(f"{label}: query_start_loc ends at {int(v[-1])}, the event has {bound['Ttot']} tokens")


__all__ = ["DictSource", "TensorMeta", "TensorSource", "validate_trace", "dtype_name"]
