"""The replay engine: run a trace's events through an implementation and compare.

Buffers start from the trace's initial buffers and evolve under the implementation's own
ops (they are never reset to the expected values), so an error shows where it first
appears and keeps showing in what depends on it. After each event, what it wrote is
compared with the event's expected tensors; after the last, the final buffers.

A trace of several layers (format v2) runs each layer's ops on that layer's buffers and
its ``commit_layers`` events through a commit context of every layer
(``traces.replay.commit_context``); coordinates then name the layer, and ``layers``
restricts the comparisons (not the run) to some of them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

import torch

from traces.replay.compare import DEFAULT_TOLERANCES, EXACT, Comparison, Tolerance, compare
from traces.format.io import Trace
from traces.format.schema import SHARED_BUFFERS, Event, TraceError
from traces.impl.loader import op_routes
from traces.ops.op import Outcome
from traces.ops.regions import record_lane
from traces.ops.table import OPS
from traces.replay.buffers import trace_layer_buffers
from traces.replay.commit_context import CommitContexts, commit_context_type

EXACT_ROLES = ("records.key_gate",)
"""Float roles compared bit for bit: the key/gate records are copies of verify's inputs."""


class ReplayFailure(Exception):
    """The implementation raised (or the device failed) while running an event."""


@dataclass
class EventReport:
    index: int
    op: str
    comparisons: list[Comparison]
    seconds: float | None = None

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.comparisons)


@dataclass
class ReplayReport:
    """What a replay found. ``events`` holds the compared events only; ``final`` is empty
    when the replay stopped before the last event."""

    trace: str
    impl: str
    device: str
    tolerances: dict[str, Tolerance]
    events: list[EventReport] = field(default_factory=list)
    final: list[Comparison] = field(default_factory=list)
    timed: bool = False
    stopped_early: bool = False
    event_range: tuple[int, int] = (0, 0)
    routes: dict[str, str] = field(default_factory=dict)
    """Op -> the implementation it ran through (``traces.impl.loader.op_routes``)."""

    @property
    def comparisons(self) -> list[Comparison]:
        return [c for e in self.events for c in e.comparisons] + self.final

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.comparisons)

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per op: events, tensors compared, events with a mismatch, median milliseconds (GPU only)."""
        out: dict[str, dict[str, Any]] = {}
        for e in self.events:
            row = out.setdefault(e.op, {"events": 0, "tensors": 0, "mismatched_events": 0, "_times": []})
            row["events"] += 1
            row["tensors"] += len(e.comparisons)
            row["mismatched_events"] += 0 if e.passed else 1
            if e.seconds is not None:
                row["_times"].append(e.seconds * 1e3)
        for row in out.values():
            times = row.pop("_times")
            row["median_ms"] = statistics.median(times) if times else None
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "trace": self.trace, "impl": self.impl, "routes": self.routes, "device": self.device,
            "passed": self.passed,
            "tolerances": {k: {"atol": t.atol, "rtol": t.rtol} for k, t in self.tolerances.items()},
            "exact": ["integer tensors", *EXACT_ROLES],
            "timing": "median of CUDA event times" if self.timed else
                      "not measured: timings through the Triton interpreter or on the CPU are not meaningful",
            "event_range": list(self.event_range), "stopped_early": self.stopped_early,
            "summary": self.summary(),
            "events": [{"index": e.index, "op": e.op, "passed": e.passed,
                        "ms": None if e.seconds is None else e.seconds * 1e3,
                        "tensors": [c.to_json() for c in e.comparisons]} for e in self.events],
            "final": [c.to_json() for c in self.final],
        }


class ReplayInterrupted(KeyboardInterrupt):
    """Ctrl-C (or a signal raised as it) during a replay; ``report`` holds the events compared
    before it."""

    def __init__(self, report: "ReplayReport"):
        super().__init__()
        self.report = report


def replay(trace: Trace, impl: ModuleType, *, device: str, impl_name: str = "",
           tolerances: dict[str, Tolerance] | None = None, events: tuple[int, int] | None = None,
           stop_at_first: bool = False, progress: Callable[[int, int], None] | None = None,
           layers: frozenset[int] | None = None) -> ReplayReport:
    """Replay ``trace`` through ``impl`` (a module from ``traces.impl.loader.load_impl``) on ``device``.

    ``events=(a, b)`` compares events ``a..b-1`` only; events before ``a`` still run, to
    build the buffers. The final buffers are compared when the replay reaches the last
    event. ``stop_at_first`` stops after the first event with a mismatch. ``layers``: compare
    only those layers' events and buffers (every layer runs); a layer the trace lacks is a
    ``TraceError``. Raises
    ``ReplayFailure`` when the implementation raises, ``ReplayInterrupted`` (a
    ``KeyboardInterrupt``, with the partial report) when interrupted.
    """
    n = len(trace.events)
    start, stop = events if events is not None else (0, n)
    tol = {**DEFAULT_TOLERANCES, **(tolerances or {})}
    timed = torch.device(device).type == "cuda"
    name = impl_name or getattr(impl, "__name__", "?")
    num_layers = trace.manifest.num_layers
    missing = sorted(set(layers or ()) - set(range(num_layers)))
    if missing:
        raise TraceError(f"layer {missing[0]} is not in the trace, which holds layers 0..{num_layers - 1}")
    routes = op_routes(impl, name)
    through_context = dict.fromkeys(e.op for e in trace.events if not OPS[e.op].per_layer)
    if through_context:
        routes.update(dict.fromkeys(through_context, commit_context_type(impl, name)[1]))
    report = ReplayReport(str(trace.path), name, device, tol, timed=timed, event_range=(start, stop), routes=routes)
    state = _Buffers(trace, impl, device, sorted(layers if layers is not None else range(num_layers)))
    try:
        stopped = _run_events(trace, state, report, start, stop, tol, timed, stop_at_first, progress)
    except KeyboardInterrupt:
        raise ReplayInterrupted(report) from None
    if not stopped and stop == n and trace.manifest.final:
        report.final = state.compare_final(tol)
    return report


def _run_events(trace: Trace, state: "_Buffers", report: ReplayReport, start: int, stop: int,
                tol: dict[str, Tolerance], timed: bool, stop_at_first: bool,
                progress: Callable[[int, int], None] | None) -> bool:
    """Run events ``0..stop-1`` on ``state``, comparing those from ``start`` into ``report``;
    whether ``stop_at_first`` stopped it at a mismatch."""
    n = len(trace.events)
    for i in range(stop):
        event = trace.events[i]
        try:
            seconds = state.run(i, event, timed)
            if i >= start and state.compared(event):
                report.events.append(EventReport(i, event.op, state.compare_event(i, event, tol), seconds))
        except (ReplayFailure, TraceError):
            raise
        except Exception as exc:  # whatever the implementation raises (a Triton error is not a RuntimeError)
            raise ReplayFailure(f"event {i} ({event.op}): {type(exc).__name__}: {exc}") from exc
        if progress is not None:
            progress(i + 1, stop)
        if stop_at_first and report.events and not report.events[-1].passed:
            report.stopped_early = i + 1 < n
            return True
    return False


def _tolerance(role: str, dtype: torch.dtype, tol: dict[str, Tolerance]) -> Tolerance:
    if not dtype.is_floating_point or role in EXACT_ROLES:
        return EXACT
    return tol[str(dtype).removeprefix("torch.")]


class _Buffers:
    """The evolving buffers of one replay, on the device, and the ops that change them:
    ``layers`` holds each layer's (sharing one plan); ``compared_layers`` those compared."""

    def __init__(self, trace: Trace, impl: ModuleType, device: str, compared_layers: list[int]):
        m = trace.manifest
        self.trace, self.impl, self.device = trace, impl, device
        self.T, self.K, self.lower_bound = m.dims.T, m.dims.K, m.lower_bound
        self.layers = trace_layer_buffers(trace, impl, device)
        self.compared_layers = compared_layers
        self.named_layers = m.version != 1  # coordinates name the layer
        self.commits = CommitContexts(impl, self.layers, m.conv, self.T, self.lower_bound)
        self.out: torch.Tensor | None = None  # the last verify's output

    def compared(self, event: Event) -> bool:
        """Whether ``event``'s results are compared: any but a per-layer event of a layer
        left out."""
        return not OPS[event.op].per_layer or event.attrs.get("layer", 0) in self.compared_layers

    def run(self, index: int, event: Event, timed: bool) -> float | None:
        """Run one event on the buffers; return its GPU time in seconds when ``timed``."""
        x = {role: t.to(self.device) for role, t in self.trace.tensors(event.inputs).items()}
        op = OPS[event.op]
        target = self.layers[event.attrs.get("layer", 0)] if op.per_layer else self.commits
        out = None
        if op.out_like is not None:
            out = self.out = torch.full_like(x[op.out_like], float("nan"))  # a token left unwritten shows as NaN
        call = op.call(self.impl, x, event.attrs, target, self.T, self.lower_bound, out)
        if not timed:
            call()
            return None
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        call()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / 1e3

    # -- comparison -------------------------------------------------------------------

    def compare_event(self, index: int, event: Event, tol: dict[str, Tolerance]) -> list[Comparison]:
        if not event.expected:
            return []
        op = OPS[event.op]
        layer = event.attrs.get("layer", 0)
        named = self.named_layers and op.per_layer  # an op of every layer names it per element
        base = {"event": index, "op": event.op, **({"layer": layer} if named else {})}
        cpu = self.trace.tensors(event.inputs)
        slots = cpu["state_indices"].long()
        batch = slots.shape[0]
        rec_key = "record_rows" if "record_rows" in cpu else "record_indices"
        rec = cpu[rec_key].long() if rec_key in cpu else torch.arange(batch)
        outcome = Outcome(cpu, slots, rec, self.layers[layer], [self.layers[i] for i in self.compared_layers],
                          self.compared_layers, self.out, self.T, self.K, self.trace.manifest.conv,
                          lambda: self._written(event, batch))
        results = []
        for role, name in event.expected.items():
            if role == "slots":  # names the slots that "states" holds; nothing to compare
                continue
            expected = self.trace.tensor(name)
            if not op.per_layer:  # its expected tensors hold every layer's
                expected = expected[self.compared_layers]
            actual, mask, locate = op.actual(role, outcome)
            c = compare(actual, expected, _tolerance(role, expected.dtype, tol), tensor=name, role=role, mask=mask)
            for bad in (c.first_bad, c.worst_bad):
                if bad is not None:
                    bad.coords = {**base, "tensor": role, **locate(bad.index)}
            results.append(c)
        return results

    def _written(self, event: Event, batch: int):
        """The slots an event's expected ``slots`` names, and a function from a slot to the
        first batch row whose plan sends its fold there (None if the plan names none)."""
        written = self.trace.tensor(event.expected["slots"]).long()
        plan = self.layers[0].plan
        final = plan.final_state_indices[:batch].cpu().long()
        boundary = plan.boundary_state_indices[:batch].cpu().long()

        def row_of(slot: int) -> int | None:
            rows = ((final == slot) | (boundary == slot)).nonzero()
            return int(rows[0, 0]) if len(rows) else None
        return written, row_of

    def compare_final(self, tol: dict[str, Tolerance]) -> list[Comparison]:
        m = self.trace.manifest
        shared = [(0, role, m.final[role]) for role in SHARED_BUFFERS]
        own = [(i, role, m.layer(i).final[role]) for i in self.compared_layers for role in m.buffer_roles()]
        results = []
        for layer, role, name in [*own, *shared]:
            expected = self.trace.tensor(name)
            actual = self.layers[layer].as_roles()[role]
            c = compare(actual, expected, _tolerance(role, expected.dtype, tol), tensor=name, role=role)
            where = {"layer": layer} if self.named_layers and role not in SHARED_BUFFERS else {}
            for bad in (c.first_bad, c.worst_bad):
                if bad is not None:
                    bad.coords = {"event": "final", "op": "-", "tensor": role, **where,
                                  **_buffer_coords(role, bad.index, self.K, m.conv)}
            results.append(c)
        return results


def _buffer_coords(role: str, i: tuple[int, ...], K: int, conv) -> dict[str, Any]:
    if role == "conv_state":
        channel, position = (i[1], i[2]) if conv.layout == "dim_first" else (i[2], i[1])
        return {"slot": i[0], "channel": channel, "position": position}
    if role == "checkpoint_state":
        return {"slot": i[0], "head": i[1], "v": i[2], "k": i[3]}
    if role.startswith("records."):
        return {"record_row": i[0], "head": i[1], "t": i[2], **record_lane(role, i[3], K)}
    if role == "pending":
        return {"record_row": i[0]}
    return {"plan_row": i[0]}


__all__ = ["EventReport", "ReplayFailure", "ReplayReport", "replay"]
