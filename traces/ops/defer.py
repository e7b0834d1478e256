"""``defer``: per batch row, add the planned commit length to its record row's pending count
and take it out of the plan, or keep it when the row commits eagerly (docs/design.md §7)."""

from __future__ import annotations

from traces.ops.op import Op
from traces.ops.regions import copy_pending, pending_counts, plan_rows
from traces.ops.roles import SLOTS, Role, int32

INPUTS = {
    "state_indices": SLOTS,
    "record_rows": int32(("B",), "record_row"),
    "eager": Role(("B",), "flag", required=False),
}
EXPECTED = {"pending": int32(("R",)), "commit_lens": int32(("B",))}
"""All of ``pending``, plan ``commit_lens[:B]``."""


def call(api, x, attrs, bufs, T: int, lower_bound, out=None):
    return lambda: api.kda_recoverssm_defer(bufs.plan, x["state_indices"], x["record_rows"], bufs.pending,
                                            x.get("eager"))


def apply_expected(e, x, bufs, T: int, conv) -> None:
    if "commit_lens" in e:
        bufs.plan.commit_lens[: e["commit_lens"].shape[0]] = e["commit_lens"].to(bufs.pool.device)
    copy_pending(e, bufs)


def actual(role: str, o):
    return pending_counts(o) if role == "pending" else plan_rows(role, o)


def written(x, attrs, returned, bufs, conv) -> dict:
    return {"pending": bufs.pending, "commit_lens": bufs.plan.commit_lens[:x["state_indices"].shape[0]]}


def defer_bytes(batch: int, eager: bool = False) -> int:
    """Per row: slot, record row and commit length read (``eager``: and a one-byte flag);
    pending and commit length written."""
    return 5 * 4 * batch + (batch if eager else 0)


def event_bytes(s, T: int, x, plan, pending) -> tuple[int, int]:
    return defer_bytes(len(x["state_indices"]), eager="eager" in x), 0


def workload_bytes(s, batch: int, spec_len: int, commit_lens: list[int]) -> int:
    return defer_bytes(batch)


OP = Op("defer", INPUTS, EXPECTED, ("layer",), call, apply_expected, actual, written, api="kda_recoverssm_defer",
        reads_plan=True, event_bytes=event_bytes, workload_bytes=workload_bytes, order=3)
