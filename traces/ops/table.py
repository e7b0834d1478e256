"""The op table: every op of the trace format by name, in the order the format lists them;
the names and API functions the other stages read. An op is added by writing its module
(``traces.ops.op.Op``) and naming it here."""

from __future__ import annotations

from traces.ops import commit, commit_layers, defer, flush, plan, verify, write
from traces.ops.op import Op

OPS: dict[str, Op] = {op.name: op for op in (verify.OP, plan.OP, defer.OP, commit.OP, flush.OP, write.OP,
                                            commit_layers.OP)}
KERNEL_OPS = tuple(name for name, op in OPS.items() if op.api is not None)
"""The ops of one layer that are kernel calls."""
LAYER_OPS = tuple(name for name, op in OPS.items() if op.per_layer)
"""Ops on one layer's buffers, named by their attr ``layer`` (absent: 0)."""
API = {name: op.api for name, op in OPS.items() if op.api is not None}
"""Op name in a trace -> function name every implementation exposes."""
