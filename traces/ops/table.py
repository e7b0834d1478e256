"""The op table: every op of the trace format by name, and the names and API functions the
other stages read. Every module of ``traces.ops`` that defines ``OP`` (an ``Op``) is an op of
the table, in the order of their ``order``: an op is added by writing its module."""

from __future__ import annotations

import importlib
import pkgutil
from types import SimpleNamespace

import traces.ops
from traces.ops.op import Op


def _collect() -> dict[str, Op]:
    modules = (importlib.import_module(f"traces.ops.{m.name}") for m in pkgutil.iter_modules(traces.ops.__path__))
    ops = sorted((m.OP for m in modules if isinstance(getattr(m, "OP", None), Op)), key=lambda op: op.order)
    return {op.name: op for op in ops}


OPS: dict[str, Op] = _collect()
"""Op name -> its ``Op``, in the order the format lists them (its error messages too)."""
KERNEL_OPS = tuple(name for name, op in OPS.items() if op.api is not None)
"""The ops of one layer that are kernel calls."""
LAYER_OPS = tuple(name for name, op in OPS.items() if op.per_layer)
"""Ops on one layer's buffers, named by their attr ``layer`` (absent: 0)."""
API = {name: op.api for name, op in OPS.items() if op.api is not None}
"""Op name in a trace -> function name every implementation exposes."""
op_name = SimpleNamespace(**{name: name for name in OPS})
"""``op_name.verify`` is ``"verify"``: each op's name, for the stages that write events
(``traces.record``, ``traces.synth``) without spelling it."""
