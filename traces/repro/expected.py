"""A tape's expected results computed by an oracle, for a tape of any number of layers.

``with_expected`` plays every step through the oracle (``traces.replay.play.Player``: each
layer's ops on its buffers, ``commit_layers`` through the oracle's commit context) and
reads back what each step wrote, as ``kda record`` records it (``traces.record``): verify's
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
from traces.format.schema import PLAN_FIELDS, SHARED_BUFFERS
from traces.record.recorder import written_slots


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
    right after it ran; ``result`` is what its op returned."""
    x, B = step.inputs, step.batch
    if step.op == "commit_layers":
        by_row = step.attrs.get("records", "slot") == "batch_row"
        slots = written_slots(layers[0].plan, x["state_indices"], torch.arange(B) if by_row else x["state_indices"])
        history = tape.conv.width - 1
        windows = [b.conv[slots.to(b.conv.device)] for b in layers]
        windows = [w[:, :, :history] if tape.conv.layout == "dim_first" else w[:, :history] for w in windows]
        return {"slots": slots.to(torch.int32), "states": torch.stack([b.pool[slots.to(b.pool.device)] for b in layers]),
                "conv_windows": torch.stack(windows)}
    bufs = layers[step.attrs.get("layer", 0)]
    if step.op == "verify":
        rows = x.get("record_indices", torch.arange(B)).long().clamp(min=0).to(bufs.pool.device)
        return {"out": result, "records.correction": bufs.records.correction[rows],
                "records.key_gate": bufs.records.key_gate[rows]}
    if step.op == "plan":
        return {f: getattr(bufs.plan, f)[:B] for f in PLAN_FIELDS}
    if step.op == "defer":
        return {"pending": bufs.pending, "commit_lens": bufs.plan.commit_lens[:B]}
    if step.op in ("commit", "flush"):
        rows = x["record_rows"] if step.op == "flush" else x.get("record_indices", torch.arange(B))
        slots = written_slots(bufs.plan, x["state_indices"], rows)
        states = {"slots": slots.to(torch.int32), "states": bufs.pool[slots.to(bufs.pool.device)]}
        return {**states, "pending": bufs.pending} if step.op == "flush" else states
    return {}


def _cpu(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {role: t.detach().to("cpu", copy=True) for role, t in tensors.items()}


__all__ = ["played", "with_expected", "written"]
