"""A trace held in memory, and playing its events through an implementation.

``Tape`` is the editable form of a trace: every tensor loaded, events as ``Step`` objects
that carry their tensors by role. Tools that rewrite traces (slicing, shrinking) edit a
tape and write it back with ``Tape.write`` (which validates).

A tape of format v2 holds every layer: layer 0's tensors in ``params``, ``initial`` and
``final`` (with the shared plan's), the others' in ``further_layers``, as the manifest
names them.

``play`` runs a tape's events through any object exposing the kernel API (a module, or a
``traces.record.recorder.Recorder``), starting from the tape's initial buffers, and returns the
buffers after the last event played; ``play_layers`` does so for every layer, running the
``commit_layers`` events through a commit context of the api (``Player``). With
``patch=True`` every buffer region an event's expected results describe is overwritten with
them after the event, so the buffers follow the recording wherever it recorded something.

``event_call`` is the one place where an event becomes a kernel call: ``play``, the replay
(``traces.replay.engine``) and the trace bench (``traces.bench``) all run events through it, the
last two on an opened trace's buffers (``trace_buffers``). A ``write`` event is applied by
kda itself (``apply_write``), whatever the implementation.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import torch

from traces.format.io import Trace, TraceBuilder
from traces.format.schema import (NULL_ID, PLAN_FIELDS, SHARED_BUFFERS, BufferSizes, ConvSpec, Dims, Manifest,
                                  TraceError)


@dataclass
class Step:
    """One event: op, tensors by role, attrs."""

    op: str
    inputs: dict[str, torch.Tensor]
    expected: dict[str, torch.Tensor] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def batch(self) -> int:
        """Batch rows of a kernel call; 0 for a ``write``."""
        slots = self.inputs.get("state_indices")
        return 0 if slots is None else slots.shape[0]


@dataclass
class LayerTensors:
    """One layer's own tensors (not the shared plan's), by role: ``params``, ``initial`` and
    ``final`` (``schema.LAYER_BUFFERS`` and, with conv state, ``conv_state``; ``final`` may
    be empty)."""

    params: dict[str, torch.Tensor]
    initial: dict[str, torch.Tensor]
    final: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class Tape:
    """A whole trace in memory. ``initial`` and ``final`` map ``schema.BUFFERS`` roles (and
    ``conv_state`` with ``conv``) to layer 0's and the shared plan's tensors (``final`` may be
    empty); ``params`` maps ``A_log`` and ``dt_bias``; ``further_layers`` holds layers 1..,
    whose final buffers are written only where ``final`` is not empty."""

    dims: Dims
    activation_dtype: str
    state_dtype: str
    lower_bound: float | None
    params: dict[str, torch.Tensor]
    initial: dict[str, torch.Tensor]
    steps: list[Step]
    final: dict[str, torch.Tensor] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    further_layers: list[LayerTensors] = field(default_factory=list)
    conv: ConvSpec | None = None

    @classmethod
    def load(cls, trace: Trace) -> "Tape":
        """Every tensor of an opened trace (``traces.format.io.read_trace``), any version,
        loaded on the CPU."""
        m, tensors = trace.manifest, trace.tensors
        steps = [Step(e.op, tensors(e.inputs), tensors(e.expected), dict(e.attrs)) for e in m.events]
        further = [LayerTensors(tensors(x.params), tensors(x.initial), tensors(x.final)) for x in m.further_layers]
        return cls(m.dims, m.activation_dtype, m.state_dtype, m.lower_bound, tensors(m.params), tensors(m.initial),
                   steps, tensors(m.final), dict(m.provenance), further, m.conv)

    @property
    def num_layers(self) -> int:
        return 1 + len(self.further_layers)

    @property
    def version(self) -> int:
        """The trace format it writes: 2 for several layers or conv state, else 1."""
        return 2 if self.further_layers or self.conv is not None else 1

    def layer(self, index: int) -> LayerTensors:
        """Layer ``index``'s own tensors (for layer 0 without the shared plan's)."""
        if index > 0:
            return self.further_layers[index - 1]
        return LayerTensors(self.params, _own(self.initial), _own(self.final))

    def with_layers(self, layers: list[LayerTensors], plan: dict[str, torch.Tensor],
                    final_plan: dict[str, torch.Tensor] | None = None, **changes: Any) -> "Tape":
        """A copy whose layers are ``layers`` (layer 0 first) and shared plan ``plan`` (and
        ``final_plan`` where the layers have final buffers)."""
        first, rest = layers[0], list(layers[1:])
        final = {**first.final, **(final_plan or {})} if first.final else {}
        return replace(self, params=first.params, initial={**first.initial, **plan}, final=final,
                       further_layers=rest, **changes)

    def sizes(self) -> BufferSizes:
        return BufferSizes(self.initial["checkpoint_state"].shape[0], self.initial["pending"].shape[0],
                           self.initial["plan.commit_lens"].shape[0])

    def builder(self) -> TraceBuilder:
        manifest = Manifest(self.dims, self.activation_dtype, self.state_dtype, self.lower_bound, self.sizes(),
                            {}, {}, provenance=dict(self.provenance), conv=self.conv)
        b = TraceBuilder(manifest)
        b.set_params(self.params["A_log"], self.params["dt_bias"])
        b.set_buffers("initial", self.initial)
        if self.final:
            b.set_buffers("final", self.final)
        for i, layer in enumerate(self.further_layers, start=1):
            b.set_params(layer.params["A_log"], layer.params["dt_bias"], layer=i)
            b.set_buffers("initial", layer.initial, layer=i)
            if self.final:  # final buffers are all or none: layer 0's say which
                b.set_buffers("final", layer.final, layer=i)
        for s in self.steps:
            b.add_event(s.op, s.inputs, s.expected, s.attrs)
        return b

    def write(self, path) -> None:
        """Validate and write atomically (``traces.format.io.write_trace``); raises ``TraceError``."""
        self.builder().write(path)

    def with_steps(self, steps: list[Step], **changes: Any) -> "Tape":
        """A copy with other steps (and other fields); tensors are shared, not copied."""
        return replace(self, steps=steps, **changes)


def _own(buffers: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A layer's own buffers among ``buffers`` (the shared plan's left out)."""
    return {role: t for role, t in buffers.items() if role not in SHARED_BUFFERS}


def require_one_layer(manifest: Manifest) -> None:
    """Refuse a trace of several layers or with conv state (format v2), which the tools of
    one layer's buffers (``trace_buffers``) do not read: ``TraceError``."""
    if manifest.version != 1:
        raise TraceError(f"the trace holds {manifest.num_layers} layer(s)"
                         f"{' with conv state' if manifest.conv is not None else ''} (format v2), which only "
                         "kda replay, kda slice, kda repro and kda info read")


@dataclass
class Buffers:
    """What the ops of one layer read besides their inputs, on one device: the buffers they
    mutate (``conv``: the layer's conv state pool, or None) and the parameters. The layers
    of a trace share one ``plan``."""

    pool: torch.Tensor
    records: Any
    pending: torch.Tensor
    plan: Any
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    conv: torch.Tensor | None = None

    def as_roles(self) -> dict[str, torch.Tensor]:
        return {"checkpoint_state": self.pool, "records.correction": self.records.correction,
                "records.key_gate": self.records.key_gate, "pending": self.pending,
                **{f"plan.{f}": getattr(self.plan, f) for f in PLAN_FIELDS},
                **({"conv_state": self.conv} if self.conv is not None else {})}

    @classmethod
    def from_roles(cls, tensors: Mapping[str, torch.Tensor], api, device: str, copy: bool = True,
                   plan: Any = None) -> "Buffers":
        """Buffers from ``{role: tensor}`` (every ``schema.BUFFERS`` role, or the layer's own
        with a shared ``plan``; ``A_log`` and ``dt_bias``; optionally ``conv_state``), moved to
        ``device`` (copied when ``copy``), in ``api``'s buffer types."""
        b = {role: t.to(device, copy=copy) for role, t in tensors.items()}
        plan = plan if plan is not None else api.CommitPlan(*(b[f"plan.{f}"] for f in PLAN_FIELDS))
        return cls(b["checkpoint_state"], api.KDARecoverSSMRecords(b["records.correction"], b["records.key_gate"]),
                   b["pending"], plan, b["A_log"], b["dt_bias"], b.get("conv_state"))


def initial_buffers(tape: Tape, api, device: str) -> Buffers:
    """Fresh copies of the tape's initial buffers and parameters on ``device``, in ``api``'s
    buffer types."""
    return Buffers.from_roles({**tape.initial, **tape.params}, api, device)


def trace_buffers(trace: Trace, api, device: str) -> Buffers:
    """An opened trace's initial buffers and parameters, loaded (checksums checked) onto
    ``device``, in ``api``'s buffer types; a trace of one layer (``require_one_layer``)."""
    m = trace.manifest
    require_one_layer(m)
    return Buffers.from_roles(trace.tensors({**m.params, **m.initial}), api, device, copy=False)


def trace_layer_buffers(trace: Trace, api, device: str) -> list[Buffers]:
    """Each layer's initial buffers and parameters of an opened trace (any version), loaded
    onto ``device`` in ``api``'s buffer types, all sharing the trace's one plan."""
    m = trace.manifest
    first = Buffers.from_roles(trace.tensors({**m.params, **m.initial}), api, device, copy=False)
    layers = [first]
    for i in range(1, m.num_layers):
        names = m.layer(i)
        layers.append(Buffers.from_roles(trace.tensors({**names.params, **names.initial}), api, device, copy=False,
                                         plan=first.plan))
    return layers


def event_call(api, op: str, x: Mapping[str, torch.Tensor], attrs: Mapping[str, Any], bufs: Buffers, T: int,
               lower_bound: float | None, out: torch.Tensor | None = None) -> Callable[[], Any]:
    """One event's call through ``api`` on ``bufs``, ready to run (and to run again): ``x``
    holds its inputs by role, on the device; ``out`` is verify's output (None: the op
    allocates it). The thunk returns what the op returns."""
    A_log, dt_bias, lb = bufs.A_log, bufs.dt_bias, lower_bound
    if op == "verify":
        return lambda: api.kda_recoverssm_verify(
            x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], A_log, dt_bias, lb, bufs.pool, bufs.records,
            x["query_start_loc"], x["state_indices"], T, out=out, record_indices=x.get("record_indices"))
    if op == "plan":
        return lambda: api.kda_recoverssm_plan(bufs.plan, x["num_accepted"], x["query_start_loc"],
                                               x["state_indices"], T, x.get("block_table"), x.get("num_computed"),
                                               attrs.get("block_size"))
    if op == "defer":
        return lambda: api.kda_recoverssm_defer(bufs.plan, x["state_indices"], x["record_rows"], bufs.pending,
                                                x.get("eager"))
    if op == "commit":
        return lambda: api.kda_recoverssm_commit(bufs.pool, bufs.records, A_log, dt_bias, lb, x["state_indices"],
                                                 bufs.plan, x.get("record_indices"))
    if op == "write":
        return lambda: apply_write(x, bufs)
    keep = {} if attrs.get("consume_pending", True) else {"consume_pending": False}
    return lambda: api.kda_recoverssm_flush(bufs.pool, bufs.records, A_log, dt_bias, lb, x["state_indices"],
                                            x["record_rows"], bufs.pending, bufs.plan, **keep)


def apply_write(x: Mapping[str, torch.Tensor], bufs: Buffers) -> None:
    """Set the buffer regions a ``write`` event names (``schema.INPUTS["write"]``) to its contents."""
    dev = bufs.pool.device
    if "conv_slots" in x:
        bufs.conv[x["conv_slots"].long().to(dev)] = x["conv_states"].to(dev)
    if "slots" in x:
        bufs.pool[x["slots"].long().to(dev)] = x["states"].to(dev)
    if "rows" in x:
        rows = x["rows"].long().to(dev)
        bufs.records.correction[rows] = x["records.correction"].to(dev)
        bufs.records.key_gate[rows] = x["records.key_gate"].to(dev)
    for role, buf in {**bufs.as_roles(), "A_log": bufs.A_log, "dt_bias": bufs.dt_bias}.items():
        if role in x and role not in ("records.correction", "records.key_gate", "conv_state"):
            buf.copy_(x[role].to(dev))


def initial_layer_buffers(tape: Tape, api, device: str) -> list[Buffers]:
    """Fresh copies of every layer's initial buffers and parameters on ``device``, in
    ``api``'s buffer types, all sharing layer 0's plan."""
    first = initial_buffers(tape, api, device)
    return [first] + [Buffers.from_roles({**x.initial, **x.params}, api, device, plan=first.plan)
                      for x in tape.further_layers]


class Player:
    """Runs a tape's steps through ``api`` on ``layers`` (one ``Buffers`` a layer, sharing
    one plan): a per-layer op on the layer its attr ``layer`` names, a ``commit_layers``
    through the commit context of its records and rule (opened over every layer when first
    needed, ``traces.format.commit_context.CommitContexts``)."""

    def __init__(self, tape: Tape, api, layers: list[Buffers], device: str):
        from traces.format.commit_context import CommitContexts

        self.tape, self.api, self.layers, self.device = tape, api, layers, device
        self.commits = CommitContexts(api, layers, tape.conv, tape.dims.T, tape.lower_bound)

    def __call__(self, step: Step):
        """Run ``step``; return what the op returns."""
        x = {role: t.to(self.device) for role, t in step.inputs.items()}
        if step.op != "commit_layers":
            return event_call(self.api, step.op, x, step.attrs, self.layers[step.attrs.get("layer", 0)],
                              self.tape.dims.T, self.tape.lower_bound)()
        return self.commits.call(x, step.attrs)()


def call(api, step: Step, bufs: Buffers, tape: Tape, device: str):
    """Run one per-layer step through ``api`` on ``bufs``; returns what the op returns."""
    return Player(tape, api, [bufs], device)(step)


def play(tape: Tape, api, device: str = "cpu", stop: int | None = None, patch: bool = False,
         bufs: Buffers | None = None, progress: Callable[[int, int], None] | None = None) -> Buffers:
    """Run steps ``0..stop-1`` (all by default) of a one-layer tape through ``api`` on
    ``bufs`` (default: fresh ``initial_buffers``); return the buffers after them.
    ``progress(done, total)`` follows every step."""
    return play_layers(tape, api, device, stop, patch, [bufs] if bufs else None, progress)[0]


def play_layers(tape: Tape, api, device: str = "cpu", stop: int | None = None, patch: bool = False,
                layers: list[Buffers] | None = None,
                progress: Callable[[int, int], None] | None = None) -> list[Buffers]:
    """``play`` for a tape of any number of layers (``Player``) on ``layers`` (default: fresh
    ``initial_layer_buffers``); returns every layer's buffers. With ``patch``, each step's
    expected results are written into the buffers after it (``apply_expected``)."""
    layers = layers or initial_layer_buffers(tape, api, device)
    player = Player(tape, api, layers, device)
    steps = tape.steps[:stop]
    for i, step in enumerate(steps):
        player(step)
        if patch:
            apply_expected(step, layers, tape)
        if progress is not None:
            progress(i + 1, len(steps))
    return layers


def apply_expected(step: Step, layers: list[Buffers], tape: Tape) -> None:
    """Overwrite the buffer regions ``step``'s expected results describe with those results
    (a ``commit_layers``'s in every layer, another op's in the layer it names)."""
    e, x = step.expected, step.inputs
    if step.op == "commit_layers":
        if "slots" not in e:
            return
        history = tape.conv.width - 1
        for i, bufs in enumerate(layers):
            slots = e["slots"].long().to(bufs.pool.device)
            if "states" in e:
                bufs.pool[slots] = e["states"][i].to(bufs.pool.device)
            if "conv_windows" in e:
                window = e["conv_windows"][i].to(bufs.conv.device)
                if tape.conv.layout == "dim_first":
                    bufs.conv[slots, :, :history] = window
                else:
                    bufs.conv[slots, :history] = window
        return
    bufs, T = layers[step.attrs.get("layer", 0)], tape.dims.T
    dev = bufs.pool.device
    if step.op == "verify":
        slots = x["state_indices"].long()
        rec = x["record_indices"].long() if "record_indices" in x else torch.arange(slots.shape[0])
        qsl = x["query_start_loc"].long()
        lens = (qsl[1:] - qsl[:-1]).clamp(0, T)
        for b in ((slots > NULL_ID) & (rec >= 0)).nonzero().flatten().tolist():
            n, row = int(lens[b]), int(rec[b])
            for role, buf in (("records.correction", bufs.records.correction),
                              ("records.key_gate", bufs.records.key_gate)):
                if role in e:
                    buf[row, :, :n] = e[role][b, :, :n].to(dev)
    elif step.op == "plan":
        for f in PLAN_FIELDS:
            if f in e:
                getattr(bufs.plan, f)[: e[f].shape[0]] = e[f].to(dev)
    elif step.op == "defer" and "commit_lens" in e:
        bufs.plan.commit_lens[: e["commit_lens"].shape[0]] = e["commit_lens"].to(dev)
    if "pending" in e and step.op in ("defer", "flush"):
        bufs.pending.copy_(e["pending"].to(dev))
    if "states" in e and "slots" in e:
        bufs.pool[e["slots"].long().to(dev)] = e["states"].to(dev)


def rebased(tape: Tape, start: int, oracle, device: str = "cpu",
            progress: Callable[[int, int], None] | None = None) -> Tape:
    """The tape from step ``start`` on, its initial buffers the state before that step:
    steps ``0..start-1`` played through ``oracle`` (every layer; ``commit_layers`` through
    the oracle's commit context) with their expected results patched in (``progress`` as
    for ``play``)."""
    if start == 0:
        return tape
    layers = play_layers(tape, oracle, device, stop=start, patch=True, progress=progress)
    cpu = [{role: t.detach().to("cpu", copy=True) for role, t in b.as_roles().items()} for b in layers]
    plan = {role: t for role, t in cpu[0].items() if role in SHARED_BUFFERS}
    own = [LayerTensors(tape.layer(i).params, _own(c), tape.layer(i).final) for i, c in enumerate(cpu)]
    final_plan = {r: t for r, t in tape.final.items() if r in SHARED_BUFFERS}
    return tape.with_layers(own, plan, final_plan, steps=tape.steps[start:])


__all__ = ["Buffers", "LayerTensors", "Player", "Step", "Tape", "apply_expected", "call", "event_call",
           "initial_buffers", "initial_layer_buffers", "play", "play_layers", "rebased", "require_one_layer",
           "trace_buffers", "trace_layer_buffers"]
