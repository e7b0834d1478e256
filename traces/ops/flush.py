"""``flush``: fold every record row's pending count into its slot and consume it (kda's
contract), or leave the counts as the documented flush plan kernel does (attr
``consume_pending`` false); the plan receives the flush plan (docs/design.md §7)."""

from __future__ import annotations

from traces.ops.commit import commit_bytes
from traces.ops.op import Op
from traces.ops.regions import copy_pending, pending_counts, place_states, states_at, written_slots, written_states
from traces.ops.roles import SLOTS, WRITTEN_STATES, int32

INPUTS = {
    "state_indices": SLOTS,
    "record_rows": int32(("B",), "record_row"),
}
EXPECTED = {**WRITTEN_STATES, "pending": int32(("R",))}


def call(api, x, attrs, bufs, T: int, lower_bound, out=None):
    keep = {} if attrs.get("consume_pending", True) else {"consume_pending": False}
    return lambda: api.kda_recoverssm_flush(bufs.pool, bufs.records, bufs.A_log, bufs.dt_bias, lower_bound,
                                            x["state_indices"], x["record_rows"], bufs.pending, bufs.plan, **keep)


def apply_expected(e, x, bufs, T: int, conv) -> None:
    copy_pending(e, bufs)
    place_states(e, bufs)


def actual(role: str, o):
    return pending_counts(o) if role == "pending" else written_states(o)


def written(x, attrs, returned, bufs, conv) -> dict:
    """The slots it wrote, their states and the pending counts."""
    return {**states_at(bufs.pool, written_slots(bufs.plan, x["state_indices"], x["record_rows"])),
            "pending": bufs.pending}


def flush_bytes(s, pending: list[int]) -> int:
    """The flush plan (slot, record row, pending read; pending and four plan columns written
    per row), then a commit of each row's pending count."""
    return 8 * 4 * len(pending) + commit_bytes(s, pending)


def event_bytes(s, T: int, x, plan, pending) -> tuple[int, int]:
    """The flush plan of every row, then the commit of each live row's pending count (a
    record row shared by two rows is folded once)."""
    slots = x["state_indices"]
    rows, left, counts = x["record_rows"], list(pending), []
    for b in range(len(slots)):
        live = slots[b] > 0 and rows[b] >= 0
        counts.append(min(max(left[rows[b]], 0), T) if live else 0)
        if live:
            left[rows[b]] = 0
    return flush_bytes(s, counts), sum(counts)


def workload_bytes(s, batch: int, spec_len: int, commit_lens: list[int]) -> int:
    return flush_bytes(s, commit_lens)


OP = Op("flush", INPUTS, EXPECTED, ("consume_pending", "layer"), call, apply_expected, actual,
        written, api="kda_recoverssm_flush", row_space="opens", flags=("consume_pending",), event_bytes=event_bytes,
        workload_bytes=workload_bytes, folds=True, cost_weight=0.7, order=5)
