"""The trace being recorded (``Recording``): its events, buffers, first-seen snapshots, shards.

``Recording`` is the one interface of the parts that read a program's calls (``recorder``,
``patch``, ``launches``, ``routing``, ``commit_context`` of ``traces.record``): each makes
events through its public methods alone.

It keeps what a trace needs, whatever the calls that feed it: the buffers it binds per trace
layer (the first pool, records, pending counts, plan, parameters and conv state seen, by
role), the first-seen contents of the regions each event touches (state slots, record rows
and conv state slots; small buffers whole; whole pools with ``snapshot="all"``), the caps,
and one pair of shards an event under ``<path>.shards``. An event is ``begin`` (inputs and
snapshots, written before the call), ``call`` (the call; when it raises the event is undone)
and ``end`` (the expected results); ``discard`` undoes one begun. ``accepts`` says whether a
call on given buffers is one of the trace's; ``skip`` counts a call passed through
unrecorded, ``stop`` ends the recording (``stopped_by``). ``close()`` merges the shards into
the trace.

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
from types import MappingProxyType
from typing import Any, Mapping

import torch

from traces.record.capture import CAPTURED_NOTE
from traces.record.graph_calls import GraphCalls, follow_graphs
from traces.record.watch import WHOLE, BufferWatch, Contents, region
from traces.format.schema import KERNEL_OPS, NULL_ID
from traces.record.shards import (
    MergeResult, RecordError, host_copy, merge_shards, save_shard, shards_dir, stale_shards,
)
from traces.format.validate import dtype_name
from traces.record.options import check_options
from traces.ops.table import op_name


class Recording:
    """The events of the trace ``path`` as they are recorded (see the module docstring).

    ``impl``: the name of what the recorded calls run, for the provenance. ``ops`` keeps only
    those ops (note: the buffers then change between kept events without a record, so such a
    trace replays exactly only where nothing skipped touched the same slots). ``graphs``: record
    the verifies CUDA graphs hold at each replay (``traces.record.graph_calls``). ``max_events``
    and ``max_bytes`` stop recording once reached (the byte cap counts shard bytes; the event
    that crosses it is still completed). Raises ``RecordError`` for an option out of range
    (``check_options``) and while ``<path>.shards`` exists (``stale_shards``).

    Layers (format v2): each trace layer has a book of its own (bound buffers, regions seen);
    ``select_layer`` picks the one the next call is on, whose events carry the attr ``layer``.
    The plan is the trace's shared plan whichever layer's plan tensor a call passes: what the
    trace says is in it is one copy, and a layer's plan that differs from it is a ``write``.

    Read by the parts: ``events``, ``skipped`` (by reason), ``stopped`` (why it ended, or
    None), ``closed``, ``open_event`` (begun, not ended), ``ops``, ``provenance`` (they may add
    to it), ``lower_bound`` (``(value,)`` once known), ``bytes`` (of shards), ``watch``.
    """

    def __init__(self, path: str | os.PathLike, impl: str, *, snapshot: str = "touched",
                 ops: tuple[str, ...] | list[str] | None = None, max_events: int | None = None,
                 max_bytes: int | None = None, graphs: bool = False):
        check_options(snapshot, ops, max_events, max_bytes, graphs)
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
        self.open_event: OpenEvent | None = None
        self.closed = False
        self.lower_bound: tuple[float | None] | None = None
        self._books: list[_Book] = [_Book()]
        self._layer = 0
        self._conv: dict[str, Any] | None = None
        self._seen_whole: set[str] = set()
        self._max_batch = 1
        self.watch = BufferWatch()
        from traces.format.provenance import trace_provenance

        self.provenance: dict[str, Any] = trace_provenance(
            "kda record", command=shlex.join(sys.argv), impl=impl, snapshot=snapshot, ops=list(self.ops),
            started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), pid=os.getpid())
        self.graphs: GraphCalls | None = follow_graphs(self) if graphs else None

    # -- layers and their buffers -----------------------------------------------------

    @property
    def layer(self) -> int:
        """The trace layer the next calls are on."""
        return self._layer

    @property
    def layers(self) -> int:
        """How many trace layers the recording has (each made on first use)."""
        return len(self._books)

    @property
    def bound(self) -> Mapping[str, torch.Tensor]:
        """The current layer's bound buffers, by role (``bind`` adds to them)."""
        return MappingProxyType(self._bound)

    def bound_on(self, layer: int) -> Mapping[str, torch.Tensor]:
        """Trace layer ``layer``'s bound buffers, by role."""
        return MappingProxyType(self._books[layer].bound)

    @property
    def conv(self) -> dict[str, Any] | None:
        """The trace's conv state (``layout``, ``dim``, ``width``), once ``bind_conv`` said it."""
        return None if self._conv is None else dict(self._conv)

    @property
    def _bound(self) -> dict[str, torch.Tensor]:
        return self._books[self._layer].bound

    def select_layer(self, layer: int) -> None:
        """Make trace layer ``layer`` the one the next calls are on (its book made on first use)."""
        while len(self._books) <= layer:
            self._books.append(_Book())
        self._layer = layer

    def bind(self, role: str, tensor: torch.Tensor) -> None:
        """Bind ``tensor`` as the current layer's ``role`` buffer, unless one is bound already."""
        self._bound.setdefault(role, tensor)

    def bind_conv(self, conv_state: torch.Tensor, layout: str, width: int) -> None:
        """Bind the current layer's conv state pool (``[N, dim, S]`` for ``dim_first``, ``[N, S,
        dim]`` for ``token_first``) of convolution ``width``: the trace then has conv state."""
        self.bind("conv_state", conv_state)
        self._conv = {"layout": layout, "dim": int(conv_state.shape[1 if layout == "dim_first" else 2]),
                      "width": int(width)}

    # -- which calls are recorded -----------------------------------------------------

    def accepts(self, op: str, bind: dict[str, torch.Tensor], lower_bound, spec_query_len,
                lower_bound_used: bool = True) -> bool:
        """Whether a call of ``op`` on the buffers ``bind`` (by role; ``lower_bound`` and
        ``spec_query_len`` where it takes them) is recorded on the current layer: recording,
        ``op`` kept, and the buffers the bound ones (else counted in ``skipped``). Buffers
        unlike another layer's end the recording (``stopped``): the trace's layers share
        their shapes."""
        if self.closed or self.stopped or op not in self.ops:
            self.skipped[op] = self.skipped.get(op, 0) + 1
            return False
        bound = self._bound
        same = all(same_tensor(bound[r], t) for r, t in bind.items() if r in bound)
        if lower_bound_used and self.lower_bound is not None:
            same = same and self.lower_bound == (lower_bound,)
        correction = bound.get("records.correction")
        if spec_query_len is not None and correction is not None:
            same = same and correction.shape[2] == spec_query_len
        if not same:
            self.skipped[op] = self.skipped.get(op, 0) + 1
            return False
        unlike = self.unlike_other_layers(bind)
        if unlike is not None:  # the trace ends before this call
            self.stop(unlike, quiet=True)
            return False
        return True

    def unlike_other_layers(self, bind: dict[str, torch.Tensor]) -> str | None:
        """Why the buffers ``bind`` cannot be the current layer's: another layer's buffer of the
        same role has another shape or dtype (None when none has)."""
        for role, t in bind.items():
            for i, book in enumerate(self._books):
                other = book.bound.get(role)
                if other is not None and (other.shape, other.dtype) != (t.shape, t.dtype):
                    return (f"layer {self._layer}'s {role} is {list(t.shape)} {t.dtype}, layer {i}'s "
                            f"{list(other.shape)} {other.dtype}: the layers of a trace share their shapes")
        return None

    def skip(self, reason: str) -> None:
        """Count a call passed through unrecorded under ``reason`` (``skipped_calls``); the
        first ``captured`` one says on stderr how captured steps can be recorded
        (``traces.record.capture``)."""
        if reason == "captured" and "captured" not in self.skipped:
            print(CAPTURED_NOTE, file=sys.stderr)
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def stop(self, reason: str, quiet: bool = False) -> None:
        """End the recording before the call at hand (``stopped_by``; the first reason stays),
        with one line on stderr unless ``quiet``."""
        if self.stopped is None:
            self.stopped = reason
            if not quiet:
                print(f"kda record: recording stopped: {reason}", file=sys.stderr)

    # -- an event: begin, call, end ---------------------------------------------------

    def begin(self, op: str, inputs: dict[str, torch.Tensor | None], attrs: dict, slots, rows,
              bind: dict[str, torch.Tensor], lower_bound: tuple | None = None,
              layers: list[int] | None = None, contents: Contents | None = None) -> "OpenEvent":
        """Begin an event of ``op`` on the current layer: bind new buffers (``bind``, by role),
        record what changed since the trace last described the regions this call touches
        (``slots``, record ``rows``; a ``write`` event), snapshot first-seen regions, write the
        inputs shard. ``lower_bound`` is ``(value,)`` for ops that take one. ``layers``: the
        trace layers a ``commit_layers`` event spans (their buffers bound before), whose regions
        among ``slots`` it touches; their snapshots are named ``layers.<l>.snap.<role>``.
        ``contents``: the regions as the call saw them, by role (``traces.record.watch.Rows``; a
        CUDA graph's call), read instead of the bound buffers for the write and the snapshots."""
        undo = ([book.copy() for book in self._books], set(self._seen_whole), self.lower_bound)
        here = self._layer
        for role, t in bind.items():
            self.bind(role, t)
        touched: dict[int, tuple[list[int], list[int], list[int]]] = {}
        for layer in ([here] if layers is None else layers):
            self.select_layer(layer)
            touched[layer] = self._touched(slots, rows)
            self._write_changes(*touched[layer], contents=contents)  # true whatever the call does: not undone
        undo = (*undo, self.stopped, self.bytes, self._max_batch, self.calls)
        tensors: dict[str, torch.Tensor] = {}
        for role, t in inputs.items():
            if t is not None:
                tensors[f"in.{role}"] = host_copy(t)
        self._max_batch = max(self._max_batch, inputs["state_indices"].shape[0])
        regions = {}
        for layer, (s, r, c) in touched.items():
            self.select_layer(layer)
            snaps = self._snapshots(slots, rows, lower_bound, contents)
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
        self.open_event = OpenEvent(index, undo, regions, here)
        return self.open_event

    def _layer_attr(self, layers: list[int] | None) -> dict[str, int]:
        """The ``layer`` attr of a per-layer event on the current layer (none on layer 0 or for
        an event that spans layers)."""
        return {"layer": self._layer} if layers is None and self._layer else {}

    def call(self, event: "OpenEvent", run):
        """``run()``, the call of ``event``: when it raises, the event is undone (``discard``,
        counted as ``raised``) and the exception goes on."""
        try:
            return run()
        except BaseException:
            # the call raised: it is not an event of the trace
            self.discard(event)
            self.skipped["raised"] = self.skipped.get("raised", 0) + 1
            raise

    def discard(self, event: "OpenEvent") -> None:
        """Undo ``event`` (begun, not ended): its shard removed, what it bound and saw forgotten."""
        (self.shards / f"{event.index:06d}.in.safetensors").unlink(missing_ok=True)
        self.open_event = None
        self.events -= 1
        books, self._seen_whole, self.lower_bound, self.stopped, self.bytes, self._max_batch, self.calls = event.undo
        self._books[:len(books)] = books
        self._layer = event.layer

    def end(self, event: "OpenEvent", expected: dict[str, torch.Tensor], contents: Contents | None = None) -> None:
        """Complete ``event`` with its ``expected`` results (by role) in its output shard; its
        regions are noted as the buffers (or ``contents``, ``begin``'s, as the call left them) hold them."""
        tensors = {f"expected.{role}": host_copy(t) for role, t in expected.items()}
        self.bytes += save_shard(self.shards / f"{event.index:06d}.out.safetensors", tensors, {"index": event.index})
        self.open_event = None
        for layer, regions in event.regions.items():
            self.select_layer(layer)
            self.watch.note(self._bound, self._key, *regions, contents=contents)
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

    def _write_changes(self, slots: list[int], rows: list[int], conv: list[int], contents: Contents | None = None
                       ) -> None:
        """A ``write`` event (on the current layer) holding every region among ``slots``,
        ``rows``, ``conv`` and the whole buffers whose contents (``contents``' where given)
        differ from what the trace says (``BufferWatch.changes``); none when nothing does."""
        tensors, changed = self.watch.changes(self._bound, self._key, slots, rows, conv, contents)
        if not tensors:
            return
        index = self.events
        meta = {"index": index, "op": op_name.write, "attrs": self._layer_attr(None), "context": self._context()}
        self.bytes += save_shard(self.shards / f"{index:06d}.in.safetensors", tensors, meta)
        self.bytes += save_shard(self.shards / f"{index:06d}.out.safetensors", {}, {"index": index})
        self.events += 1
        self.watch.note(self._bound, self._key, *changed, contents=contents)

    def _key(self, role: str) -> str:
        """The current layer's name for ``role`` in the watch and the first-seen set (the plan is shared)."""
        return role if self._layer == 0 or role.startswith("plan.") else f"layers.{self._layer}.{role}"

    def _snapshots(self, slots, rows, lower_bound, contents: Contents | None = None) -> dict[str, torch.Tensor]:
        """Copy the regions of the current layer's bound buffers (or ``contents``) first seen by this call."""
        out: dict[str, torch.Tensor] = {}
        book = self._books[self._layer]
        for role in WHOLE:
            if role in self._bound and self._key(role) not in self._seen_whole:
                self._seen_whole.add(self._key(role))
                out[f"snap.{role}"] = host_copy(self._bound[role])
        if lower_bound is not None and self.lower_bound is None:
            self.lower_bound = lower_bound
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
                    source = _SNAPSHOT_SOURCE.get(name, name)
                    out[f"snap.{name}"] = host_copy(region(self._bound[source], source, new, contents))
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
                       lower_bound=self.lower_bound[0] if self.lower_bound else None)
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

    def close(self, provenance: dict[str, Any] | None = None) -> MergeResult | None:
        """Stop recording and merge the shards into ``path`` (then remove them), the trace's
        provenance completed with ``provenance`` (what is known only once recording ends).
        Returns None when nothing was recorded. Raises ``RecordError`` (shards kept) when they
        cannot make a trace. Closing twice is a no-op."""
        if self.closed:
            return None
        self.closed = True
        if self.graphs is not None:
            self.graphs.close()
        if self.events == 0:
            shutil.rmtree(self.shards, ignore_errors=True)
            return None
        extra = {"skipped_calls": dict(self.skipped), "stopped_by": self.stopped, **(provenance or {})}
        result = merge_shards(self.shards, self.path, extra)
        shutil.rmtree(self.shards, ignore_errors=True)
        return result


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
class OpenEvent:
    """An event begun (``Recording.begin``), to be ended or discarded."""

    index: int
    undo: tuple  # what was seen and bound before it, restored when the call raises
    regions: dict[int, tuple[list[int], list[int], list[int]]]
    """Per trace layer: the slots, record rows and conv slots the trace describes as the call leaves them."""
    layer: int  # the layer selected when it began


def _union(indices: list[int], seen: torch.Tensor | None) -> list[int]:
    """``indices`` and those of a first-seen snapshot's index tensor, sorted."""
    return sorted(set(indices) | set(seen.tolist() if seen is not None else ()))


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` are the same buffer (address, shape, dtype, device)."""
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.dtype == b.dtype and a.device == b.device


def _ints(t: torch.Tensor, lo: int, hi: int) -> list[int]:
    """Distinct values of ``t`` in ``[lo, hi)``."""
    v = t.reshape(-1).cpu().long()
    return sorted(set(v[(v >= lo) & (v < hi)].tolist()))


__all__ = ["OpenEvent", "Recording", "same_tensor"]
