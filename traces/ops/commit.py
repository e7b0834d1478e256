"""``commit``: fold each batch row's first ``commit_lens[b]`` records into its checkpoint, at
the slots the plan names (docs/design.md §6)."""

from __future__ import annotations

from traces.ops.op import Op, default_record_rows
from traces.ops.regions import place_states, states_at, written_slots, written_states
from traces.ops.roles import SLOTS, WRITTEN_STATES, int32

INPUTS = {
    "state_indices": SLOTS,
    "record_indices": int32(("B",), "record_row", required=False),
}
EXPECTED = dict(WRITTEN_STATES)


def call(api, x, attrs, bufs, T: int, lower_bound, out=None):
    return lambda: api.kda_recoverssm_commit(bufs.pool, bufs.records, bufs.A_log, bufs.dt_bias, lower_bound,
                                             x["state_indices"], bufs.plan, x.get("record_indices"))


def apply_expected(e, x, bufs, T: int, conv) -> None:
    place_states(e, bufs)


def actual(role: str, o):
    return written_states(o)


def written(x, attrs, returned, bufs, conv) -> dict:
    """The slots it wrote and their states."""
    import torch

    rows = x.get("record_indices", torch.arange(x["state_indices"].shape[0]))
    return states_at(bufs.pool, written_slots(bufs.plan, x["state_indices"], rows))


def commit_bytes(s, commit_lens: list[int]) -> int:
    """Per row with ``n > 0``: the slot read and written, and ``n`` tokens of records read
    (``s``: a ``traces.bench.contract_bytes.Shape``)."""
    folding = [n for n in commit_lens if n > 0]
    return len(folding) * 2 * s.slot_bytes + sum(folding) * s.record_token_bytes


def event_bytes(s, T: int, x, plan, pending) -> tuple[int, int]:
    """Per folding row: its slot read, each slot its plan writes written, its records read."""
    slots = x["state_indices"]
    B = len(slots)
    rec = x.get("record_indices") or list(range(B))
    total = folded = 0
    for b in range(B):
        n = min(plan["commit_lens"][b], T)
        if n <= 0 or slots[b] <= 0 or rec[b] < 0:
            continue
        written = (plan["final_state_indices"][b] > 0) + (
            plan["boundary_state_indices"][b] > 0 and 1 <= plan["boundary_recovery_lens"][b] <= n)
        total += (1 + written) * s.slot_bytes + n * s.record_token_bytes
        folded += n
    return total, folded


def workload_bytes(s, batch: int, spec_len: int, commit_lens: list[int]) -> int:
    return commit_bytes(s, commit_lens)


OP = Op("commit", INPUTS, EXPECTED, ("layer",), call, apply_expected, actual, written, api="kda_recoverssm_commit",
        reads_plan=True, record_rows=default_record_rows, event_bytes=event_bytes, workload_bytes=workload_bytes,
        folds=True, cost_weight=0.7, order=4)
