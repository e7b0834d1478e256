"""Which layer of a model a patched call is on, and which layers are recorded (``--layer``,
``--layers``).

A model has one set of buffers per layer, told apart by the order in which their state pools
and pending counts were first used (a call on neither, by its plan's). A ``LayerRouter``
picks, for each call, the trace layer it is recorded on, or none: with ``layer`` the one
layer of a version 1 trace, with ``layers`` (``all`` or model layer numbers) several, each a
layer of a version 2 trace in model order. It selects that layer in the recording
(``traces.record.events.Recording.select_layer``); the provenance says how many layers were
seen (``layers_seen``).
"""

from __future__ import annotations

import torch

from traces.record.events import Recording
from traces.record.shards import RecordError


def parse_layers(value: str) -> str | list[int]:
    """``--layers``: ``all``, or distinct model layer numbers ``0,7`` (returned sorted).
    Raises ``RecordError``."""
    if value.strip() == "all":
        return "all"
    parts = [part.strip() for part in value.split(",")]
    if not parts or not all(part.isdigit() for part in parts):
        raise RecordError(f"--layers {value}: expected all or layer numbers >= 0 such as 0,7")
    layers = sorted({int(part) for part in parts})
    if len(layers) != len(parts):
        raise RecordError(f"--layers {value}: a layer named twice")
    return layers


class LayerRouter:
    """Routes calls to the trace layers of ``recording`` (module docstring). ``layer``: the one
    model layer of a version 1 trace; ``chosen`` (``parse_layers``' result; instead of
    ``layer``): the model layers of a version 2 trace, or None for a version 1 trace."""

    def __init__(self, recording: Recording, layer: int = 0, chosen: str | list[int] | None = None):
        self.recording, self.layer, self.chosen = recording, layer, chosen
        self._seen: dict[str, list[tuple]] = {"checkpoint_state": [], "pending": [], "plan": []}

    def model_layer(self, kind: str, t: torch.Tensor) -> int:
        """The model layer whose ``kind`` buffer (``checkpoint_state``, ``pending``, ``plan``: its
        ``commit_lens`` column) ``t`` is: the order in which such buffers were first used."""
        seen, key = self._seen[kind], (t.data_ptr(), t.device)
        if key not in seen:
            seen.append(key)
        return seen.index(key)

    def trace_layer(self, model: int) -> int | None:
        """The trace layer of model layer ``model``, or None when it is not recorded."""
        if self.chosen is None:
            return 0 if model == self.layer else None
        if self.chosen == "all":
            return model
        return self.chosen.index(model) if model in self.chosen else None

    def route(self, checkpoint_state=None, pending=None, plan=None) -> bool:
        """Select the trace layer of a call on these buffers and say whether it is recorded.
        Its layer is that of its state pool and pending counts (both, when it passes both:
        they must agree); a call on neither is, in a version 1 trace, on the chosen layer once
        that layer's buffers are bound (or for layer 0), and in a trace of several layers on
        the layer of its plan (``plan``: its ``commit_lens`` column)."""
        models = {self.model_layer(kind, t) for kind, t in (("checkpoint_state", checkpoint_state),
                                                            ("pending", pending)) if t is not None}
        if not models and self.chosen is None:
            self.recording.select_layer(0)
            return self.layer == 0 or any(role in self.recording.bound for role in ("checkpoint_state", "pending"))
        if not models and plan is not None:
            models = {self.model_layer("plan", plan)}
        layer = self.trace_layer(models.pop()) if len(models) == 1 else None
        if layer is None:
            return False
        self.recording.select_layer(layer)
        return True

    def layers_seen(self) -> int:
        """How many model layers the program used (by their state pools or pending counts)."""
        return max(len(self._seen[kind]) for kind in ("checkpoint_state", "pending"))


__all__ = ["LayerRouter", "parse_layers"]
