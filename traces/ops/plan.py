"""``plan``: the commit plan of each batch row from its accepted count, right after sampling;
in align mode also from the request's block table (docs/design.md §6)."""

from __future__ import annotations

from traces.ops.op import Op
from traces.ops.regions import plan_rows
from traces.ops.roles import PLAN_FIELDS, QSL, SLOTS, int32

INPUTS = {
    "num_accepted": int32(("B",)),
    "query_start_loc": QSL,
    "state_indices": SLOTS,
    "block_table": int32(("B", "W"), "slot", required=False),
    "num_computed": int32(("B",), "nonneg", required=False),
}
EXPECTED = {name: int32(("B",)) for name in PLAN_FIELDS}
"""The first B rows of the plan."""


def call(api, x, attrs, bufs, T: int, lower_bound, out=None):
    return lambda: api.kda_recoverssm_plan(bufs.plan, x["num_accepted"], x["query_start_loc"], x["state_indices"],
                                           T, x.get("block_table"), x.get("num_computed"), attrs.get("block_size"))


def apply_expected(e, x, bufs, T: int, conv) -> None:
    dev = bufs.pool.device
    for f in PLAN_FIELDS:
        if f in e:
            getattr(bufs.plan, f)[: e[f].shape[0]] = e[f].to(dev)


def written(x, attrs, returned, bufs, conv) -> dict:
    B = x["state_indices"].shape[0]
    return {f: getattr(bufs.plan, f)[:B] for f in PLAN_FIELDS}


def plan_bytes(batch: int, align: bool = False) -> int:
    """num_accepted, query_start_loc [B+1], state_indices read (``align``: also num_computed
    and two block-table entries a row); four int32 plan columns written."""
    return 4 * (3 * batch + 1) + (4 * 3 * batch if align else 0) + 4 * 4 * batch


def event_bytes(s, T: int, x, plan, pending) -> tuple[int, int]:
    return plan_bytes(len(x["state_indices"]), align="block_table" in x), 0


def workload_bytes(s, batch: int, spec_len: int, commit_lens: list[int]) -> int:
    return plan_bytes(batch)


OP = Op("plan", INPUTS, EXPECTED, ("block_size", "layer"), call, apply_expected, plan_rows, written,
        api="kda_recoverssm_plan", row_space="opens", align=True, event_bytes=event_bytes,
        workload_bytes=workload_bytes, order=2)
