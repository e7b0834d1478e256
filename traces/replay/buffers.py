"""The buffers a played trace evolves, one ``Buffers`` a layer on one device, in an
implementation's buffer types: fresh copies of a tape's initial buffers, or an opened trace's
loaded onto the device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from traces.format.io import Trace
from traces.format.schema import PLAN_FIELDS, Manifest, TraceError
from traces.format.tape import Tape


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


def initial_layer_buffers(tape: Tape, api, device: str) -> list[Buffers]:
    """Fresh copies of every layer's initial buffers and parameters on ``device``, in
    ``api``'s buffer types, all sharing layer 0's plan."""
    first = initial_buffers(tape, api, device)
    return [first] + [Buffers.from_roles({**x.initial, **x.params}, api, device, plan=first.plan)
                      for x in tape.further_layers]


__all__ = ["Buffers", "initial_buffers", "initial_layer_buffers", "require_one_layer", "trace_buffers",
           "trace_layer_buffers"]
