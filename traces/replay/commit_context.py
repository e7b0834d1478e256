"""The engine's commit of every layer where a trace is played (``commit_layers`` events,
docs/design.md §10): in a replay, a slice or a repro's tape.

``open_commit_context`` is the one place a replay builds the commit context it runs those
events through: ``kernels.context.reference.ReferenceCommitContext`` for ``--impl
reference``, the implementation's own ``KDARecoverSSMCommitContext`` where its module has
one, else kda's (``kernels.context.engine``), for the records and align-mode rule the
event names (attrs ``records`` and ``rule``). The context plans into the trace's shared plan
buffer, so that the plan a ``commit_layers`` event leaves is the trace's like any other.
"""

from __future__ import annotations

import inspect
from typing import Any

from traces.format.schema import ConvSpec


def commit_context_type(impl, name: str = "") -> tuple[Any, str]:
    """The commit context class ``impl`` (called ``name``) runs ``commit_layers`` through,
    and how the report's routes name it."""
    from kernels import reference
    from kernels.context.engine import KDARecoverSSMCommitContext
    from kernels.context.reference import ReferenceCommitContext

    if impl is reference:
        return ReferenceCommitContext, "reference (kernels.context.reference)"
    own = getattr(impl, "KDARecoverSSMCommitContext", None)
    if own is not None and own is not KDARecoverSSMCommitContext:
        return own, getattr(own, "route", None) or f"{name or getattr(impl, '__name__', '?')} (KDARecoverSSMCommitContext)"
    return KDARecoverSSMCommitContext, "triton (kernels.context.engine)"


def open_commit_context(impl, layers: list, conv: ConvSpec, spec_query_len: int,
                        lower_bound: float | None, records: str = "slot", rule: str = "kda"):
    """A commit context over the replay's ``layers`` (one ``traces.replay.buffers.Buffers`` a
    layer, each with its conv state pool), for windows of ``spec_query_len`` tokens and batches
    of up to the shared plan's rows, keeping ``records`` under ``rule``
    (``kernels.commit_rules``); its plan is that shared plan.
    Raises ``ValueError`` when the context class cannot take them."""
    from kernels.context.engine import CommitLayer

    context_type, _ = commit_context_type(impl)
    first = layers[0]
    H, _, K = first.pool.shape[1:]
    model = [CommitLayer((b.conv, b.pool, b.records.correction, b.records.key_gate), b.A_log, b.dt_bias, H, K,
                         lower_bound) for b in layers]
    context = context_type.create(model, spec_query_len=spec_query_len, max_num_reqs=first.plan.max_batch,
                                  conv_dim_first=conv.layout == "dim_first",
                                  **context_options(context_type, records, rule))
    context.plan = first.plan
    return context


def context_options(context_type, records: str, rule: str) -> dict[str, str]:
    """``create``'s ``records`` and ``rule`` for ``context_type``: both where it takes them;
    none where it takes neither and they are kda's (records per slot, kda's rule), which is
    what such a context does. Raises ``ValueError`` otherwise."""
    takes = inspect.signature(context_type.create).parameters
    options = {}
    for option, value, default in (("records", records, "slot"), ("rule", rule, "kda")):
        if option in takes:
            options[option] = value
        elif value != default:
            raise ValueError(f"{context_type.__name__}.create takes no {option}: it cannot replay a commit of "
                             f"{option} {value!r} (docs/trace-format.md)")
    return options


class CommitContexts:
    """The commit contexts a played trace runs its ``commit_layers`` events through, over
    ``layers`` (one ``traces.replay.buffers.Buffers`` a layer): one for each ``(records, rule)``
    the events name (kda's where absent), opened (``open_commit_context``) when first needed."""

    def __init__(self, impl, layers: list, conv: ConvSpec, spec_query_len: int, lower_bound: float | None):
        self.impl, self.layers, self.conv = impl, layers, conv
        self.spec_query_len, self.lower_bound = spec_query_len, lower_bound
        self.opened: dict[tuple[str, str], Any] = {}

    def open(self, records: str = "slot", rule: str = "kda"):
        """The context of ``records`` and ``rule``, opened the first time it is asked for."""
        key = records, rule
        if key not in self.opened:
            self.opened[key] = open_commit_context(self.impl, self.layers, self.conv, self.spec_query_len,
                                                   self.lower_bound, *key)
        return self.opened[key]
