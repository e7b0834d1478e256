"""What a replay's events cost under the Triton interpreter, from the trace's sizes alone
(shapes from the safetensors header; no tensor data is read): an estimate of the run time
before it starts, and the weights of an ETA while it runs.

The interpreter runs every program of a kernel as Python over numpy blocks, so an op's time
grows with its programs (batch rows times heads) and, more slowly, with a head's K x V state
tile; plan and defer are small. Measured with triton 3.6 on a 2-core CPU: a verify at H=12,
K=V=128 takes about 5 s a batch row, a commit or flush about two thirds of that; at H=2,
K=V=16 about 0.2 s a row. It is the cost of an implementation that runs Triton kernels
(``runs_triton``); one built on the torch reference takes a fraction of it.
"""

from __future__ import annotations

import sys
from types import ModuleType

from traces.format.io import Trace
from traces.ops.table import OPS

TILE_OVERHEAD = 3700
"""A program's cost besides its K x V state tile, in tile elements."""
SMALL_OP_UNITS = 1000.0
"""A plan or a defer (a few tens of milliseconds)."""
REFERENCE_MODULES = ("kernels.reference", "kernels.context.reference", "kernels.buffers", "kernels.contract")
"""kda's modules that launch no Triton kernel: the torch reference and what it is built on."""
SECONDS_PER_UNIT = 2.2e-5
"""Interpreter seconds per unit on the 2-core CPU measured: for a rough figure before any
event has run; the ETA is calibrated on the events that have."""


def event_units(trace: Trace) -> list[float]:
    """Each event's cost in units: batch rows x heads x (K*V + ``TILE_OVERHEAD``) x its op's
    weight (``traces.ops``' ``cost_weight``: verify, commit and flush), times the layers for an
    op of every layer (commit_layers); ``SMALL_OP_UNITS`` for plan, defer and write."""
    d = trace.manifest.dims
    per_row = d.H * (d.K * d.V + TILE_OVERHEAD)
    units = []
    for event in trace.events:
        op = OPS[event.op]
        if op.cost_weight is None:
            units.append(SMALL_OP_UNITS)
            continue
        rows = trace.meta(event.inputs["state_indices"]).shape[0]
        layers = 1 if op.per_layer else trace.manifest.num_layers
        units.append(op.cost_weight * layers * rows * per_row)
    return units


def runs_triton(impl) -> bool:
    """Whether ``impl`` (from ``traces.impl.loader.load_impl``) runs Triton kernels, which
    this cost is of: one whose routes send an op to kda's kernels (a documented or released
    surface: its plan and commit are kda's), or a module that holds Triton kernels or the
    ``triton`` package, or takes anything from one of kda's ``kernels`` other than
    ``REFERENCE_MODULES`` or from another module that imports ``triton``. A module built on
    the reference is not (an exception class of ``triton``'s aside)."""
    from traces.impl.surface import KDA, routes_by_implementation

    routes = getattr(impl, "routes", None)
    if isinstance(routes, dict):
        return KDA in routes_by_implementation(routes)
    sources = {impl.__name__}
    for value in vars(impl).values():
        name = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None) or ""
        if type(value).__module__.startswith("triton.") or isinstance(value, ModuleType) and _top(name) == "triton":
            return True  # a Triton kernel (triton.jit and its wrappers), or triton itself
        if name and _top(name) != "triton":
            sources.add(name)
    return any(_launches_triton(name) for name in sources)


def _top(name: str) -> str:
    return name.partition(".")[0]


def _launches_triton(name: str) -> bool:
    """Whether the module ``name`` is one of kda's Triton modules, or imports ``triton``."""
    if _top(name) == "kernels":
        return name not in REFERENCE_MODULES
    module = sys.modules.get(name)
    return module is not None and any(isinstance(v, ModuleType) and _top(v.__name__) == "triton"
                                      for v in vars(module).values())


def rough_seconds(units: float) -> float:
    """``units`` as interpreter seconds on the CPU measured (``SECONDS_PER_UNIT``)."""
    return units * SECONDS_PER_UNIT


__all__ = ["event_units", "rough_seconds", "runs_triton"]
