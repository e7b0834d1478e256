"""What the recorded calls inside a CUDA graph saw, at every replay of it (docs/recording.md).

``GraphHooks`` wraps a graph class's ``capture_begin``, ``capture_end`` and ``replay``
(``torch.cuda.CUDAGraph``'s: ``torch.cuda.graph`` and ``make_graphed_callables`` go through
them), so it knows which graph is being captured and calls ``on_replay(graph)`` after each
replay. ``GraphTape`` keeps, per graph, its recorded calls in capture order: while a graph is
captured, a call hands it what it reads (``before``) and, once run, what it wrote (``after``);
the tape allocates buffers of its own (from the graph's pool) and copies into them on the
device, so the graph re-runs the copies at each replay; nothing reads a tensor on the host.
After a replay, ``read(graph)`` synchronises once and returns those copies on the host.

What the tape cannot follow raises ``GraphRecordError``, whose text is the reason the
recording stops (``stopped_by``), never a wrong copy: ``before``/``after`` raise for a snap
that is not a tensor or a ``(buffer, index)`` pair of tensors, a tensor on another device
than the graph's, an index that is not of an integer dtype, a buffer without rows, attrs that
are not host scalars, no capture in progress; ``read`` raises for a graph whose capture the
hooks did not see begin (captured before they were installed, or while they were not) or
end (the capture raised), a capture begun while another was in progress (twice on one
graph, or two graphs at once: calls cannot be told apart), a call with no ``after``, and
what ``before``/``after`` raised in its capture.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Union

import torch

Snap = Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]
"""A tensor (copied whole) or ``(buffer, index)``: rows ``buffer[index]`` gathered on the device."""
_METHODS = ("capture_begin", "capture_end", "replay")


class GraphRecordError(Exception):
    """A graph's calls cannot be recorded; ``str()`` says why."""


def _cuda_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


@dataclass
class GraphState:
    """What the hooks saw of one graph: its latest capture (a count), on which device, whether
    it completed, why it cannot be recorded (None when it can), and how many replays began."""

    capture: int
    device: torch.device
    complete: bool = False
    failure: str | None = None
    replays: int = 0


class GraphHooks:
    """Wrappers on ``graph_class``'s capture and replay methods (module docstring), installed by
    ``install()`` or ``with``; ``uninstall()`` puts the original methods back, the same objects.
    ``device()`` names the device a capture is on, asked at ``capture_begin`` (default: the
    current CUDA device, that of the capturing stream)."""

    def __init__(self, on_replay: Callable[[Any], None] | None = None, graph_class: type | None = None,
                 device: Callable[[], torch.device] = _cuda_device):
        self.on_replay = on_replay
        self.graph_class = torch.cuda.CUDAGraph if graph_class is None else graph_class
        self.device = device
        self._states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._captures = 0
        self._capturing = self._replaying = None
        self._originals: dict[str, Any] | None = None

    def capturing_graph(self):
        """The graph being captured now, or None."""
        return self._capturing

    def replaying_graph(self):
        """The graph whose ``replay`` is running now, or None (a real CUDA graph runs no Python then)."""
        return self._replaying

    def state(self, graph) -> GraphState | None:
        """What the hooks saw of ``graph``; None for a graph they never saw captured."""
        return self._states.get(graph)

    def install(self) -> "GraphHooks":
        """Wrap the methods; what the hooks know of graphs starts from nothing (a graph captured
        before is one whose capture they did not see)."""
        cls = self.graph_class
        if self._originals is not None or any(hasattr(getattr(cls, m), "_graph_hooks") for m in _METHODS):
            raise GraphRecordError(f"{cls.__qualname__}'s capture and replay are already hooked")
        self._originals = {m: cls.__dict__.get(m) for m in _METHODS}
        for m, wrapper in (("capture_begin", self._capture_begin), ("capture_end", self._capture_end),
                           ("replay", self._replay)):
            setattr(cls, m, _wrap(getattr(cls, m), wrapper, self))
        self._states, self._capturing = weakref.WeakKeyDictionary(), None
        return self

    def uninstall(self) -> None:
        """Put the original methods back (a no-op when not installed)."""
        if self._originals is None:
            return
        for m, original in self._originals.items():
            if original is None:  # inherited: the class had none of its own
                delattr(self.graph_class, m)
            else:
                setattr(self.graph_class, m, original)
        self._originals = None

    def __enter__(self) -> "GraphHooks":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()

    def _capture_begin(self, original, graph, *args, **kwargs):
        busy = self._capturing
        if busy is not None:  # calls from now on cannot be told apart
            self._states[busy].failure = ("capture_begin on a graph already being captured" if busy is graph
                                          else "two graphs captured at once: their calls cannot be told apart")
        original(graph, *args, **kwargs)
        if busy is graph:
            return
        self._captures += 1
        failure = None if busy is None else self._states[busy].failure
        self._states[graph] = GraphState(self._captures, self.device(), failure=failure)
        self._capturing = graph

    def _capture_end(self, original, graph, *args, **kwargs):
        try:
            original(graph, *args, **kwargs)
            if graph in self._states:
                self._states[graph].complete = True
        finally:
            if self._capturing is graph:
                self._capturing = None

    def _replay(self, original, graph, *args, **kwargs):
        state = self._states.get(graph)
        if state is not None:
            state.replays += 1
        before, self._replaying = self._replaying, graph
        try:
            original(graph, *args, **kwargs)
        finally:
            self._replaying = before
        if self.on_replay is not None:
            self.on_replay(graph)


def _wrap(method, wrapper, hooks: GraphHooks):
    @functools.wraps(method)
    def hooked(graph, *args, **kwargs):
        return wrapper(method, graph, *args, **kwargs)

    hooked._graph_hooks = hooks
    return hooked


@dataclass
class Gathered:
    """Host copy of a ``(buffer, index)`` snap: ``index`` as the call passed it (flat), ``rows``
    ``buffer[index]`` per entry, and ``valid``, ``0 <= index < len(buffer)``. The device gathers
    at the index clamped into range (a null slot, -1, reads row 0); rows not valid are zeros here."""

    index: torch.Tensor
    rows: torch.Tensor
    valid: torch.Tensor


@dataclass
class CapturedCall:
    """One recorded call of a graph, as a replay left it: its name, the host attributes given
    at capture, host copies of what it read (``before``) and wrote (``after``), and what the
    caller kept with it at capture (``keep``, as given: not copied)."""

    name: str
    attrs: dict[str, Any]
    before: dict[str, torch.Tensor | Gathered]
    after: dict[str, torch.Tensor | Gathered]
    keep: Any = None


@dataclass
class _Call:
    name: str
    attrs: dict[str, Any]
    keep: Any = None
    before: dict[str, "_Held"] = field(default_factory=dict)
    after: dict[str, "_Held"] | None = None


@dataclass
class _Tape:
    capture: int  # the GraphState.capture it holds the calls of
    device: torch.device
    calls: list[_Call] = field(default_factory=list)
    failure: str | None = None
    replay: int = 0  # the replay whose calls Python re-runs (fakes only), and its next position
    cursor: int = 0


class GraphTape:
    """Per graph the hooks saw captured, the copies of its recorded calls (module docstring)."""

    def __init__(self, hooks: GraphHooks):
        self.hooks = hooks
        self._tapes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def before(self, name: str, snaps: dict[str, Snap], attrs: dict[str, Any] | None = None,
               keep: Any = None) -> int:
        """Copy what call ``name`` reads into the graph being captured, before the call runs: the
        graph's next call, with host scalars ``attrs`` and ``keep`` (any object, held as it is
        and handed back by ``read``: at capture only); returns its position, for ``after``."""
        return self._snapshot(None, snaps, name, attrs or {}, keep)

    def after(self, position: int, snaps: dict[str, Snap]) -> None:
        """Copy what the call at ``position`` wrote, once it has run."""
        self._snapshot(position, snaps)

    def _snapshot(self, position: int | None, snaps: dict[str, Snap], name: str = "", attrs=None,
                  keep: Any = None) -> int:
        """``before`` (``position`` None) or ``after``, one path: at capture it allocates the
        call's buffers and copies into them; while the hooks see the graph replayed (Python re-run
        under a fake graph; a real one runs none) it copies into the buffers of the call at the
        same position, as the graph's own copies do."""
        graph, replaying = self.hooks.capturing_graph(), False
        if graph is None:
            graph, replaying = self.hooks.replaying_graph(), True
        state = self.hooks.state(graph) if graph is not None else None
        if state is None:
            raise GraphRecordError(f"{name or 'a call'}: no graph capture seen by the graph hooks is in progress")
        tape = self._current(graph) or self._tapes.setdefault(graph, _Tape(state.capture, state.device))
        try:
            if state.failure or tape.failure:
                raise GraphRecordError(state.failure or tape.failure)
            phase = "before" if position is None else "after"
            if position is None:
                position = self._next(tape, state.replays if replaying else None, name, attrs, keep)
            call = tape.calls[position]
            held = getattr(call, phase) or {}
            with torch.no_grad():
                filled = {role: _fill(f"{call.name} {phase} {role}", snap, tape.device, held.get(role))
                          for role, snap in snaps.items()}
            if replaying and filled.keys() != held.keys():
                raise GraphRecordError(f"{call.name} {phase}: {sorted(filled)} at a replay, {sorted(held)} at capture")
            setattr(call, phase, filled)
            return position
        except GraphRecordError as exc:
            tape.failure = tape.failure or str(exc)
            raise

    def _next(self, tape: _Tape, replay: int | None, name: str, attrs: dict[str, Any], keep: Any) -> int:
        """The position of call ``name``: a new call at capture (``replay`` None), else the next
        one of replay number ``replay``."""
        if replay is None:
            bad = [k for k, v in attrs.items() if not isinstance(v, (bool, int, float, str, type(None)))]
            if bad:
                raise GraphRecordError(f"{name}: attrs {', '.join(bad)} are not host scalars")
            tape.calls.append(_Call(name, dict(attrs), keep))
            return len(tape.calls) - 1
        if tape.replay != replay:
            tape.replay, tape.cursor = replay, 0
        position, tape.cursor = tape.cursor, tape.cursor + 1
        if position >= len(tape.calls) or tape.calls[position].name != name:
            raise GraphRecordError(f"a replay ran {name} as call {position}, which its capture did not")
        return position

    def read(self, graph) -> list[CapturedCall]:
        """Every recorded call ``graph``'s latest capture held, in capture order, with host copies
        of what its latest replay left in the tape's buffers: one synchronisation, then copies."""
        state = self.hooks.state(graph)
        if state is None:
            raise GraphRecordError("a graph replayed whose capture the graph hooks did not see "
                                   "(captured before they were installed)")
        if state.failure:
            raise GraphRecordError(state.failure)
        if not state.complete:
            raise GraphRecordError("a graph replayed whose capture the graph hooks did not see complete")
        tape = self._current(graph)
        if tape is None:
            return []
        if tape.failure:
            raise GraphRecordError(tape.failure)
        for call in tape.calls:
            if call.after is None:
                raise GraphRecordError(f"captured call {call.name} has no after snapshot (it did not return)")
        if tape.device.type == "cuda":
            torch.cuda.synchronize(tape.device)
        return [CapturedCall(c.name, dict(c.attrs), _host(c.before), _host(c.after), c.keep) for c in tape.calls]

    def _current(self, graph) -> _Tape | None:
        """``graph``'s tape when it holds the graph's latest capture; one of an earlier capture
        is dropped (its buffers freed)."""
        tape, state = self._tapes.get(graph), self.hooks.state(graph)
        if tape is not None and (state is None or tape.capture != state.capture):
            del self._tapes[graph]
            return None
        return tape

    def bytes_held(self, graph=None) -> int:
        """Device bytes of the tape's buffers for ``graph`` (every graph's when None): per captured
        call, its snaps' copies (a gather: its rows, its index and the index as int64)."""
        tapes = [t for t in map(self._current, [graph] if graph is not None else list(self._tapes)) if t]
        return sum(b.numel() * b.element_size() for t in tapes for c in t.calls
                   for held in (c.before, c.after or {}) for h in held.values() for b in h.bufs)


@dataclass
class _Held:
    """The tape's buffers for one snap: ``(copy,)`` for a tensor; ``(index, clamped int64 index,
    rows)`` for a gather from a buffer of ``size`` rows (None for a tensor)."""

    bufs: tuple[torch.Tensor, ...]
    size: int | None = None


def _fill(what: str, snap: Snap, device: torch.device, held: _Held | None) -> _Held:
    """Copy ``snap`` into ``held`` (allocated when None, at capture). Device work only."""
    pair = isinstance(snap, tuple) and len(snap) == 2 and all(isinstance(t, torch.Tensor) for t in snap)
    if not (isinstance(snap, torch.Tensor) or pair):
        raise GraphRecordError(f"{what}: a {type(snap).__name__}, not a tensor or a (buffer, index) pair")
    for t in (snap if pair else (snap,)):
        if t.device != device:
            raise GraphRecordError(f"{what}: a tensor on {t.device}, the graph is on {device}")
    if held is not None and (held.size is not None) != pair:
        raise GraphRecordError(f"{what}: a {'gather' if pair else 'tensor'} at a replay, not at capture")
    if not pair:
        held = held or _Held((torch.empty(snap.shape, dtype=snap.dtype, device=device),))
        _check_shape(what, held.bufs[0].shape, snap.shape)
        held.bufs[0].copy_(snap)
        return held
    buffer, index = snap
    if index.dtype.is_floating_point or index.dtype.is_complex or index.dtype == torch.bool:
        raise GraphRecordError(f"{what}: index of {index.dtype}, not an integer tensor")
    if buffer.dim() == 0 or buffer.shape[0] == 0:
        raise GraphRecordError(f"{what}: a buffer without rows")
    M, shape = index.numel(), (index.numel(), *buffer.shape[1:])
    held = held or _Held((torch.empty(M, dtype=index.dtype, device=device),
                          torch.empty(M, dtype=torch.int64, device=device),
                          torch.empty(shape, dtype=buffer.dtype, device=device)), buffer.shape[0])
    raw, clamped, rows = held.bufs
    _check_shape(what, rows.shape, torch.Size(shape))
    raw.view(index.shape).copy_(index)
    clamped.copy_(raw)
    clamped.clamp_(0, buffer.shape[0] - 1)
    torch.index_select(buffer, 0, clamped, out=rows)
    return held


def _check_shape(what: str, held: torch.Size, snap: torch.Size) -> None:
    if held != snap:
        raise GraphRecordError(f"{what}: {list(snap)} at a replay, {list(held)} at capture")


def _host(held: dict[str, _Held]) -> dict[str, torch.Tensor | Gathered]:
    out: dict[str, torch.Tensor | Gathered] = {}
    for role, h in held.items():
        if h.size is None:
            out[role] = h.bufs[0].to("cpu", copy=True)
            continue
        index, rows = h.bufs[0].to("cpu", copy=True), h.bufs[2].to("cpu", copy=True)
        valid = (index >= 0) & (index < h.size)
        rows[~valid] = 0
        out[role] = Gathered(index, rows, valid)
    return out


__all__ = ["CapturedCall", "Gathered", "GraphHooks", "GraphRecordError", "GraphState", "GraphTape", "Snap"]
