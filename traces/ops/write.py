"""``write``: what changed in the buffers between two kernel calls (the engine's own writes,
calls left unrecorded), applied by kda itself whatever the implementation: new contents of
state slots, record rows, whole pending counts, plan columns and parameters, and conv slots."""

from __future__ import annotations

from traces.ops.op import Op
from traces.ops.roles import BUFFERS, PARAMS, Role, int32

INPUTS = {
    "slots": int32(("M",), "real_slot", required=False),
    "states": Role(("M", "H", "V", "K"), "state", required=False),
    "rows": int32(("Q",), "real_record_row", required=False),
    "records.correction": Role(("Q", "H", "T", "V"), "float32", required=False),
    "records.key_gate": Role(("Q", "H", "T", "2K"), "act", required=False),
    **{role: Role(r.shape, r.dtype, False, r.index) for role, r in BUFFERS.items()
       if role not in ("checkpoint_state", "records.correction", "records.key_gate")},
    **{role: Role(r.shape, r.dtype, False) for role, r in PARAMS.items()},
    "conv_slots": int32(("Mc",), "real_slot", required=False),
    "conv_states": Role(("Mc", "conv1", "conv2"), "act", required=False),
}
"""New contents of buffer regions, set before the next event runs: state ``slots``
(distinct) and their ``states``; record ``rows`` (distinct) and their records; whole pending
counts, plan columns and parameters; conv ``conv_slots`` (distinct) and their whole
``conv_states`` (a trace with conv state). Each is optional."""
GROUPS = (("slots", "states"), ("rows", "records.correction", "records.key_gate"), ("conv_slots", "conv_states"))
"""Roles of a write that come together: an index tensor and the contents it places."""


def call(api, x, attrs, bufs, T: int, lower_bound, out=None):
    return lambda: apply_write(x, bufs)


def apply_write(x, bufs) -> None:
    """Set the buffer regions a write names to its contents."""
    dev = bufs.pool.device
    if "conv_slots" in x:
        bufs.conv[x["conv_slots"].long().to(dev)] = x["conv_states"].to(dev)
    if "slots" in x:
        bufs.pool[x["slots"].long().to(dev)] = x["states"].to(dev)
    if "rows" in x:
        rows = x["rows"].long().to(dev)
        bufs.records.correction[rows] = x["records.correction"].to(dev)
        bufs.records.key_gate[rows] = x["records.key_gate"].to(dev)
    for role, buf in {**bufs.as_roles(), "A_log": bufs.A_log, "dt_bias": bufs.dt_bias}.items():
        if role in x and role not in ("records.correction", "records.key_gate", "conv_state"):
            buf.copy_(x[role].to(dev))


def apply_expected(e, x, bufs, T: int, conv) -> None:
    """A write has no expected results."""


def written(x, attrs, returned, bufs, conv) -> dict:
    return {}


OP = Op("write", INPUTS, {}, ("layer",), call, apply_expected, written=written, row_space=None,
        distinct=("slots", "rows", "conv_slots"), groups=GROUPS, empty_inputs="a write names no tensor", order=6)
