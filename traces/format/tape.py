"""A trace held in memory.

``Tape`` is the editable form of a trace: every tensor loaded, events as ``Step`` objects
that carry their tensors by role. Tools that rewrite traces (slicing, shrinking) edit a
tape and write it back with ``Tape.write`` (which validates).

A tape of format v2 holds every layer: layer 0's tensors in ``params``, ``initial`` and
``final`` (with the shared plan's), the others' in ``further_layers``, as the manifest
names them.

Playing a tape's events is ``traces.replay.play``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from traces.format.io import Trace, TraceBuilder
from traces.format.schema import SHARED_BUFFERS, BufferSizes, ConvSpec, Dims, Manifest


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


__all__ = ["LayerTensors", "Step", "Tape"]
