"""The events of a trace being recorded: buffers, first-seen snapshots, shards.

``EventRecorder`` keeps what a trace needs, whatever the calls that feed it (``Recorder``
maps the kernel API onto it, ``traces.record.patch.PatchRecorder`` patched modules): the buffers
it binds per trace layer (the first pool, records, pending counts, plan, parameters and
conv state seen, by role), the first-seen contents of the regions each event touches (state
slots, record rows and conv state slots; small buffers whole; whole pools with
``snapshot="all"``), the caps, and one pair of shards an event under ``<path>.shards``. An event is ``_begin`` (inputs and snapshots, written before the
call), ``_call`` (the call; when it raises the event is undone) and ``_end`` (the expected
results). ``close()`` merges the shards into the trace.

Whatever changed a region the trace has described since the last recorded call that
touched it (the engine's own writes, calls left unrecorded) becomes a ``write`` event just
before the call that touches it next (``traces.record.watch``), so a replay starts every
call from what the recorded call saw.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from traces.record.watch import BufferWatch
from traces.format.schema import KERNEL_OPS, NULL_ID, PLAN_FIELDS
from traces.record.shards import MergeResult, RecordError, merge_shards, save_shard
from traces.format.validate import dtype_name

SNAPSHOTS = ("touched", "all")


def check_options(snapshot: str = "touched", ops: tuple[str, ...] | list[str] | None = None,
                  max_events: int | None = None, max_bytes: int | None = None) -> None:
    """Raise ``RecordError`` for a recorder option out of range (``EventRecorder``'s options)."""
    if snapshot not in SNAPSHOTS:
        raise RecordError(f"snapshot {snapshot!r}: expected one of {', '.join(SNAPSHOTS)}")
    unknown = [op for op in ops or () if op not in KERNEL_OPS]
    if unknown:
        raise RecordError(f"ops: {', '.join(unknown)} not among {', '.join(KERNEL_OPS)}")
    for name, cap in (("max_events", max_events), ("max_bytes", max_bytes)):
        if cap is not None and cap < 1:
            raise RecordError(f"{name} must be positive, got {cap}")


def shards_dir(path: str | os.PathLike) -> Path:
    """Where the shards of trace ``path`` are spilled: ``<path>.shards``."""
    p = Path(path)
    return p.with_name(p.name + ".shards")


def stale_shards(path: str | os.PathLike) -> str:
    """Why recording into ``path`` cannot start while ``shards_dir(path)`` exists, and what to do."""
    shards = shards_dir(path)
    return (f"{shards} holds the shards of a recording that never finished: "
            f"kda record merge {shards} TRACE keeps its events; remove the folder to discard them")


class EventRecorder:
    """Records calls into ``impl`` as the events of the trace ``path`` (see the module docstring).

    ``impl``: ``kernels`` by default, any spec ``traces.impl.loader.load_impl`` accepts, or a module
    object. ``ops`` keeps only those ops (note: the buffers then change between kept events
    without a record, so such a trace replays exactly only where nothing skipped touched
    the same slots). ``max_events`` and ``max_bytes`` stop recording once reached (the
    byte cap counts shard bytes; the event that crosses it is still completed).

    Layers (format v2): each trace layer has a book of its own (bound buffers, regions seen);
    ``select_layer`` picks the one the next call is on, whose events carry the attr ``layer``.
    The plan is the trace's shared plan whichever layer's plan tensor a call passes: what the
    trace says is in it is one copy, and a layer's plan that differs from it is a ``write``.
    """

    def __init__(self, path: str | os.PathLike, impl: str | ModuleType = "kernels", *, snapshot: str = "touched",
                 ops: tuple[str, ...] | list[str] | None = None, max_events: int | None = None,
                 max_bytes: int | None = None):
        check_options(snapshot, ops, max_events, max_bytes)
        if isinstance(impl, str):
            from traces.impl.loader import ImplError, load_impl

            try:
                self.impl, impl_name = load_impl(impl), impl
            except ImplError as exc:
                raise RecordError(str(exc)) from None
        else:
            self.impl, impl_name = impl, impl.__name__
        self.path = Path(path)
        self.shards = shards_dir(self.path)
        if self.shards.exists():
            raise RecordError(stale_shards(self.path))
        self.shards.mkdir(parents=True)
        self.snapshot, self.ops = snapshot, tuple(ops) if ops else KERNEL_OPS
        self.max_events, self.max_bytes = max_events, max_bytes
        self.events = self.calls = self.bytes = 0
        self.skipped: dict[str, int] = {}
        self.stopped: str | None = None
        self.open_event: _Event | None = None  # begun, not yet ended
        self.closed = False
        self._books: list[_Book] = [_Book()]
        self._layer = 0
        self._lower_bound: tuple[float | None] | None = None
        self._conv: dict[str, Any] | None = None
        self._seen_whole: set[str] = set()
        self._max_batch = 1
        self._watch = BufferWatch()
        from traces.format.provenance import trace_provenance

        self.provenance: dict[str, Any] = trace_provenance(
            "kda record", command=shlex.join(sys.argv), impl=impl_name, snapshot=snapshot, ops=list(self.ops),
            started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), pid=os.getpid())

    def closing_provenance(self) -> dict[str, Any]:
        """Provenance known only once recording ends (none here; see ``traces.record.patch``)."""
        return {}

    @property
    def _bound(self) -> dict[str, torch.Tensor]:
        """The current layer's bound buffers, by role."""
        return self._books[self._layer].bound

    def select_layer(self, layer: int) -> None:
        """Make trace layer ``layer`` the one the next calls are on (its book made on first use)."""
        while len(self._books) <= layer:
            self._books.append(_Book())
        self._layer = layer

    def bind_conv(self, conv_state: torch.Tensor, layout: str, width: int) -> None:
        """Bind the current layer's conv state pool (``[N, dim, S]`` for ``dim_first``, ``[N, S,
        dim]`` for ``token_first``) of convolution ``width``: the trace then has conv state."""
        self._bind("conv_state", conv_state)
        self._conv = {"layout": layout, "dim": int(conv_state.shape[1 if layout == "dim_first" else 2]),
                      "width": int(width)}

    def _key(self, role: str) -> str:
        """The current layer's name for ``role`` in the watch and the first-seen set (the plan is shared)."""
        return role if self._layer == 0 or role.startswith("plan.") else f"layers.{self._layer}.{role}"

    def _begin(self, op: str, inputs: dict[str, torch.Tensor | None], attrs: dict, slots, rows,
               bind: dict[str, torch.Tensor], lower_bound: tuple | None = None,
               layers: list[int] | None = None) -> "_Event":
        """Bind new buffers, record what changed since the trace last described the regions
        this call touches (a ``write`` event), snapshot first-seen regions, write the inputs
        shard. ``lower_bound`` is ``(value,)`` for ops that take one. ``layers``: the trace
        layers a ``commit_layers`` event spans (their buffers bound before), whose regions
        among ``slots`` it touches; their snapshots are named ``layers.<l>.snap.<role>``."""
        undo = ([book.copy() for book in self._books], set(self._seen_whole), self._lower_bound)
        here = self._layer
        for role, t in bind.items():
            self._bind(role, t)
        touched: dict[int, tuple[list[int], list[int], list[int]]] = {}
        for layer in ([here] if layers is None else layers):
            self.select_layer(layer)
            touched[layer] = self._touched(slots, rows)
            self._write_changes(*touched[layer])  # true whatever the call does: not undone
        undo = (*undo, self.stopped, self.bytes, self._max_batch, self.calls)
        tensors: dict[str, torch.Tensor] = {}
        for role, t in inputs.items():
            if t is not None:
                tensors[f"in.{role}"] = _cpu(t)
        self._max_batch = max(self._max_batch, inputs["state_indices"].shape[0])
        regions = {}
        for layer, (s, r, c) in touched.items():
            self.select_layer(layer)
            snaps = self._snapshots(slots, rows, lower_bound)
            prefix = "" if layers is None else f"layers.{layer}."
            tensors.update({prefix + name: t for name, t in snaps.items()})
            regions[layer] = (_union(s, snaps.get("snap.slots")), _union(r, snaps.get("snap.rows")),
                              _union(c, snaps.get("snap.conv_slots")))
        self.select_layer(here)
        index = self.events
        meta = {"index": index, "op": op, "attrs": {**attrs, **self._layer_attr(layers)}, "context": self._context()}
        self.bytes += save_shard(self.shards / f"{index:06d}.in.safetensors", tensors, meta)
        self.events += 1
        self.calls += 1
        if self.max_events is not None and self.calls >= self.max_events:
            self.stopped = "max_events"
        elif self.max_bytes is not None and self.bytes >= self.max_bytes:  # this event still completes
            self.stopped = "max_bytes"
        # the trace now describes what the call touches and what it saw for the first time
        self.open_event = _Event(index, undo, regions, here)
        return self.open_event

    def _layer_attr(self, layers: list[int] | None) -> dict[str, int]:
        """The ``layer`` attr of a per-layer event on the current layer (none on layer 0 or for
        an event that spans layers)."""
        return {"layer": self._layer} if layers is None and self._layer else {}

    def _call(self, event: "_Event", run):
        try:
            return run()
        except BaseException:
            # the call raised: it is not an event of the trace
            self._discard(event)
            self.skipped["raised"] = self.skipped.get("raised", 0) + 1
            raise

    def _discard(self, event: "_Event") -> None:
        """Undo ``event`` (begun, not ended): its shard removed, what it bound and saw forgotten."""
        (self.shards / f"{event.index:06d}.in.safetensors").unlink(missing_ok=True)
        self.open_event = None
        self.events -= 1
        books, self._seen_whole, self._lower_bound, self.stopped, self.bytes, self._max_batch, self.calls = event.undo
        self._books[:len(books)] = books
        self._layer = event.layer

    def _end(self, event: "_Event", expected: dict[str, torch.Tensor]) -> None:
        tensors = {f"expected.{role}": _cpu(t) for role, t in expected.items()}
        self.bytes += save_shard(self.shards / f"{event.index:06d}.out.safetensors", tensors, {"index": event.index})
        self.open_event = None
        for layer, region in event.regions.items():
            self.select_layer(layer)
            self._note(*region)
        self.select_layer(event.layer)

    # -- writes between the recorded calls -------------------------------------------

    def _touched(self, slots, rows) -> tuple[list[int], list[int], list[int]]:
        """The real slots and record rows (in range of the bound buffers) a call touches, and
        its slots in range of the conv state pool."""
        pool, corr = self._bound.get("checkpoint_state"), self._bound.get("records.correction")
        conv = self._bound.get("conv_state")
        touched_slots = _ints(slots, NULL_ID + 1, pool.shape[0]) if pool is not None and slots is not None else []
        touched_rows = _ints(rows, 0, corr.shape[0]) if corr is not None and rows is not None else []
        touched_conv = _ints(slots, NULL_ID + 1, conv.shape[0]) if conv is not None and slots is not None else []
        return touched_slots, touched_rows, touched_conv

    def _write_changes(self, slots: list[int], rows: list[int], conv: list[int]) -> None:
        """A ``write`` event (on the current layer) holding every region among ``slots``,
        ``rows``, ``conv`` and the small buffers whose contents differ from what the trace
        says; none when nothing does."""
        watch, bound, key = self._watch, self._bound, self._key
        tensors: dict[str, torch.Tensor] = {}
        changed_slots: list[int] = []
        changed_rows: list[int] = []
        changed_conv: list[int] = []
        if "checkpoint_state" in bound:
            changed_slots = watch.changed_rows(key("checkpoint_state"), bound["checkpoint_state"], slots)
        if changed_slots:
            tensors.update(_rows_of("slots", {"states": bound["checkpoint_state"]}, changed_slots))
        records = {role: bound[role] for role in ("records.correction", "records.key_gate") if role in bound}
        if records:
            changed_rows = sorted({r for role, buf in records.items() for r in watch.changed_rows(key(role), buf, rows)})
        if changed_rows:
            tensors.update(_rows_of("rows", records, changed_rows))
        if "conv_state" in bound:
            changed_conv = watch.changed_rows(key("conv_state"), bound["conv_state"], conv)
        if changed_conv:
            tensors.update(_rows_of("conv_slots", {"conv_states": bound["conv_state"]}, changed_conv))
        changed_whole = [role for role in _WHOLE if role in bound and watch.changed_whole(key(role), bound[role])]
        for role in changed_whole:
            tensors[f"in.{role}"] = _cpu(bound[role])
        if not tensors:
            return
        index = self.events
        meta = {"index": index, "op": "write", "attrs": self._layer_attr(None), "context": self._context()}
        self.bytes += save_shard(self.shards / f"{index:06d}.in.safetensors", tensors, meta)
        self.bytes += save_shard(self.shards / f"{index:06d}.out.safetensors", {}, {"index": index})
        self.events += 1
        self._note(changed_slots, changed_rows, changed_conv)

    def _note(self, slots: list[int], rows: list[int], conv: list[int]) -> None:
        """The trace now describes ``slots``, ``rows``, ``conv`` slots and every bound small
        buffer of the current layer as they are."""
        watch, bound, key = self._watch, self._bound, self._key
        for role, indices in (("checkpoint_state", slots), ("records.correction", rows),
                              ("records.key_gate", rows), ("conv_state", conv)):
            if role in bound:
                watch.note_rows(key(role), bound[role], indices)
        for role in _WHOLE:
            if role in bound:
                watch.note_whole(key(role), bound[role])

    def _bind(self, name: str, tensor: torch.Tensor) -> None:
        self._bound.setdefault(name, tensor)

    def _snapshots(self, slots, rows, lower_bound) -> dict[str, torch.Tensor]:
        """Copy the regions of the current layer's bound buffers this call sees for the first time."""
        out: dict[str, torch.Tensor] = {}
        book = self._books[self._layer]
        for role in _WHOLE:
            if role in self._bound and self._key(role) not in self._seen_whole:
                self._seen_whole.add(self._key(role))
                out[f"snap.{role}"] = _cpu(self._bound[role])
        if lower_bound is not None and self._lower_bound is None:
            self._lower_bound = lower_bound
        for role, (index_name, content_names), seen, low in (
                ("checkpoint_state", ("slots", ("states",)), book.seen_slots, NULL_ID + 1),
                ("records.correction", ("rows", ("records.correction", "records.key_gate")), book.seen_rows, 0),
                ("conv_state", ("conv_slots", ("conv_states",)), book.seen_conv, NULL_ID + 1)):
            buf = self._bound.get(role)
            indices = rows if role == "records.correction" else slots
            if buf is None or indices is None:
                continue
            new = self._first_sight(seen, indices, low, buf.shape[0])
            if new:
                index = torch.tensor(new, dtype=torch.int64)
                out[f"snap.{index_name}"] = index
                for name in content_names:
                    source = self._bound[_SNAPSHOT_SOURCE.get(name, name)]
                    out[f"snap.{name}"] = _cpu(source[index.to(source.device)])
        return out

    def _first_sight(self, seen: set[int], indices, low: int, size: int) -> list[int]:
        """Indices in ``[low, size)`` this call touches (every one, with snapshot ``all``) that
        no earlier event did; they are marked seen."""
        wanted = range(size) if self.snapshot == "all" else _ints(indices, low, size)
        new = sorted(set(wanted) - seen)
        seen.update(new)
        return new

    def _context(self) -> dict[str, Any]:
        """What the manifest needs, as far as known now (each shard carries it): the first
        layer's shapes (every layer's are checked alike), the layers and the conv state."""
        ctx: dict[str, Any] = {"provenance": {**self.provenance, "skipped_calls": dict(self.skipped)},
                               "max_batch": self._max_batch}
        shaped = [b.bound for b in self._books if "checkpoint_state" in b.bound and "records.correction" in b.bound]
        if shaped:
            pool, corr = shaped[0]["checkpoint_state"], shaped[0]["records.correction"]
            N, H, V, K = pool.shape
            ctx.update(dims={"H": H, "K": K, "V": V, "T": corr.shape[2]}, num_slots=N, num_record_rows=corr.shape[0],
                       state_dtype=dtype_name(pool.dtype),
                       activation_dtype=dtype_name(shaped[0]["records.key_gate"].dtype),
                       lower_bound=self._lower_bound[0] if self._lower_bound else None)
        pending = [b.bound["pending"] for b in self._books if "pending" in b.bound]
        if pending:
            ctx["num_record_rows"] = pending[0].shape[0]
        plans = [b.bound["plan.commit_lens"] for b in self._books if "plan.commit_lens" in b.bound]
        if plans:
            ctx["plan_rows"] = plans[0].shape[0]
        if len(self._books) > 1:
            ctx["layers"] = len(self._books)
        if self._conv is not None:
            ctx["conv"] = dict(self._conv)
        return ctx

    def close(self) -> MergeResult | None:
        """Stop recording and merge the shards into ``path`` (then remove them). Returns
        None when nothing was recorded. Raises ``RecordError`` (shards kept) when they
        cannot make a trace. Closing twice is a no-op."""
        if self.closed:
            return None
        self.closed = True
        if self.events == 0:
            shutil.rmtree(self.shards, ignore_errors=True)
            return None
        extra = {"skipped_calls": dict(self.skipped), "stopped_by": self.stopped, **self.closing_provenance()}
        result = merge_shards(self.shards, self.path, extra)
        shutil.rmtree(self.shards, ignore_errors=True)
        return result

    def __enter__(self) -> "EventRecorder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_WHOLE = ("pending", "A_log", "dt_bias", *(f"plan.{f}" for f in PLAN_FIELDS))
"""Bound buffers snapshot whole at first sight (small); pools and records go by region."""
_SNAPSHOT_SOURCE = {"states": "checkpoint_state", "conv_states": "conv_state"}
"""A region snapshot's content name -> the bound buffer it is cut from (else the same name)."""


@dataclass
class _Book:
    """What the recording knows of one layer: its bound buffers by role, and the state slots,
    record rows and conv slots some event has seen."""

    bound: dict[str, torch.Tensor] = field(default_factory=dict)
    seen_slots: set[int] = field(default_factory=set)
    seen_rows: set[int] = field(default_factory=set)
    seen_conv: set[int] = field(default_factory=set)

    def copy(self) -> "_Book":
        return _Book(dict(self.bound), set(self.seen_slots), set(self.seen_rows), set(self.seen_conv))


@dataclass
class _Event:
    index: int
    undo: tuple  # what was seen and bound before it, restored when the call raises
    regions: dict[int, tuple[list[int], list[int], list[int]]]
    """Per trace layer: the slots, record rows and conv slots the trace describes as the call leaves them."""
    layer: int  # the layer selected when it began


def _union(indices: list[int], seen: torch.Tensor | None) -> list[int]:
    """``indices`` and those of a first-seen snapshot's index tensor, sorted."""
    return sorted(set(indices) | set(seen.tolist() if seen is not None else ()))


def _rows_of(index_role: str, buffers: dict[str, torch.Tensor], indices: list[int]) -> dict[str, torch.Tensor]:
    """A write's ``in.`` tensors: the indices, and those rows of each buffer by its role."""
    index = torch.tensor(indices, dtype=torch.int64)
    out = {f"in.{index_role}": index.to(torch.int32)}
    out.update({f"in.{role}": _cpu(buf[index.to(buf.device)]) for role, buf in buffers.items()})
    return out


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True).contiguous()


def _ints(t: torch.Tensor, lo: int, hi: int) -> list[int]:
    """Distinct values of ``t`` in ``[lo, hi)``."""
    v = t.reshape(-1).cpu().long()
    return sorted(set(v[(v >= lo) & (v < hi)].tolist()))


__all__ = ["SNAPSHOTS", "EventRecorder", "check_options", "shards_dir", "stale_shards"]
