"""Playing a tape's events through an implementation.

``play`` runs a tape's events through any object exposing the kernel API (a module, or a
``traces.record.recorder.Recorder``), starting from the tape's initial buffers, and returns the
buffers after the last event played; ``play_layers`` does so for every layer, running the
``commit_layers`` events through a commit context of the api (``Player``). With
``patch=True`` every buffer region an event's expected results describe is overwritten with
them after the event (``apply_expected``), so the buffers follow the recording wherever it
recorded something.

``event_call`` is the one place where an event of one layer becomes a call (its op's
``call``, ``traces.ops``): ``play``, the replay (``traces.replay.engine``) and the trace bench
(``traces.bench``) all run events through it, the last two on an opened trace's buffers
(``traces.replay.buffers.trace_buffers``). A ``write`` event is applied by kda itself,
whatever the implementation.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from traces.format.schema import SHARED_BUFFERS
from traces.format.tape import LayerTensors, Step, Tape
from traces.ops.table import OPS
from traces.replay.buffers import Buffers, initial_layer_buffers
from traces.replay.commit_context import CommitContexts


def event_call(api, op: str, x: Mapping[str, torch.Tensor], attrs: Mapping[str, Any], bufs: Buffers, T: int,
               lower_bound: float | None, out: torch.Tensor | None = None) -> Callable[[], Any]:
    """One event's call through ``api`` on ``bufs``, ready to run (and to run again): ``x``
    holds its inputs by role, on the device; ``out`` is verify's output (None: the op
    allocates it). The thunk returns what the op returns."""
    return OPS[op].call(api, x, attrs, bufs, T, lower_bound, out)


class Player:
    """Runs a tape's steps through ``api`` on ``layers`` (one ``Buffers`` a layer, sharing
    one plan): a per-layer op on the layer its attr ``layer`` names, an op of every layer
    (``commit_layers``) through the commit context of its records and rule (opened over every
    layer when first needed, ``traces.replay.commit_context.CommitContexts``)."""

    def __init__(self, tape: Tape, api, layers: list[Buffers], device: str):
        self.tape, self.api, self.layers, self.device = tape, api, layers, device
        self.commits = CommitContexts(api, layers, tape.conv, tape.dims.T, tape.lower_bound)

    def __call__(self, step: Step):
        """Run ``step``; return what the op returns."""
        x = {role: t.to(self.device) for role, t in step.inputs.items()}
        op = OPS[step.op]
        target = self.layers[step.attrs.get("layer", 0)] if op.per_layer else self.commits
        return op.call(self.api, x, step.attrs, target, self.tape.dims.T, self.tape.lower_bound, None)()


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
    (an op of every layer's in every layer, another op's in the layer it names)."""
    op = OPS[step.op]
    target = layers[step.attrs.get("layer", 0)] if op.per_layer else layers
    op.apply_expected(step.expected, step.inputs, target, tape.dims.T, tape.conv)


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
    own = [LayerTensors(tape.layer(i).params, {r: t for r, t in c.items() if r not in SHARED_BUFFERS},
                        tape.layer(i).final) for i, c in enumerate(cpu)]
    final_plan = {r: t for r, t in tape.final.items() if r in SHARED_BUFFERS}
    return tape.with_layers(own, plan, final_plan, steps=tape.steps[start:])


__all__ = ["Player", "apply_expected", "event_call", "play", "play_layers", "rebased"]
