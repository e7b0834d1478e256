"""A tape's expected results computed by an oracle, for a tape of any number of layers.

``with_expected`` plays every step through the oracle (``traces.replay.play.Player``: each
layer's ops on its buffers, ``commit_layers`` through the oracle's commit context) and
reads back what each step wrote (its op's ``written``, ``traces.ops``), as ``kda record``
records it (``traces.record``): verify's
``out`` and the records of its rows, the plan rows, the pending counts, the slots a commit
or flush wrote and their states, and for ``commit_layers`` the slots it wrote, every
layer's states and first ``W - 1`` conv entries there.
"""

from __future__ import annotations

from typing import Iterator

import torch

from traces.format.tape import LayerTensors, Step, Tape
from traces.replay.buffers import Buffers, initial_layer_buffers
from traces.replay.play import Player
from traces.format.schema import SHARED_BUFFERS
from traces.ops.table import OPS


def with_expected(tape: Tape, oracle, device: str = "cpu", final: bool = False) -> Tape:
    """``tape`` with ``oracle``'s results as its expected results; with ``final``, the
    oracle's buffers after the last step as its final buffers (else none)."""
    layers = initial_layer_buffers(tape, oracle, device)
    results = list(played(tape, oracle, device, layers))
    steps = [Step(s.op, s.inputs, e, s.attrs) for s, e in zip(tape.steps, results)]
    if not final:
        return tape.with_steps(steps, final={})
    roles = [_cpu(b.as_roles()) for b in layers]
    own = [LayerTensors(tape.layer(i).params, tape.layer(i).initial,
                        {r: t for r, t in c.items() if r not in SHARED_BUFFERS}) for i, c in enumerate(roles)]
    plan = {r: t for r, t in roles[0].items() if r in SHARED_BUFFERS}
    return tape.with_layers(own, {r: tape.initial[r] for r in SHARED_BUFFERS}, plan, steps=steps)


def played(tape: Tape, api, device: str = "cpu", layers: list[Buffers] | None = None) -> Iterator[dict]:
    """Each step's results (``written``, copied to the CPU) as ``api`` runs it on ``layers``
    (default: fresh ``initial_layer_buffers``), one step at a time."""
    layers = layers or initial_layer_buffers(tape, api, device)
    player = Player(tape, api, layers, device)
    for step in tape.steps:
        yield _cpu(written(step, player(step), layers, tape))


def written(step: Step, result, layers: list[Buffers], tape: Tape) -> dict[str, torch.Tensor]:
    """What ``step`` wrote (its expected roles, ``schema.EXPECTED``), read from ``layers``
    right after it ran (its op's ``written``, ``traces.ops``); ``result`` is what its op returned."""
    op = OPS[step.op]
    target = layers[step.attrs.get("layer", 0)] if op.per_layer else layers
    return op.written(step.inputs, step.attrs, result, target, tape.conv)


def _cpu(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {role: t.detach().to("cpu", copy=True) for role, t in tensors.items()}


__all__ = ["played", "with_expected", "written"]
