"""Buffer regions several ops write, each as its op patches it in and as a replay reads it
back for comparison: states at the slots an op wrote (``written_slots``: those a commit
with a plan writes), the pending counts, the first rows of the plan; and the coordinates of
a record's lane."""

from __future__ import annotations

from typing import Any, Mapping

from traces.ops.op import Located, Outcome
from traces.ops.roles import NULL_ID


def written_slots(plan, state_indices, record_rows):
    """Distinct slots a commit with this plan writes (docs/design.md §6), in row order (int64, CPU)."""
    import torch

    B = state_indices.shape[0]
    n = plan.commit_lens[:B].cpu().long()
    slots, rows = state_indices.reshape(-1).cpu().long(), record_rows.reshape(-1).cpu().long()
    final, boundary = plan.final_state_indices[:B].cpu().long(), plan.boundary_state_indices[:B].cpu().long()
    recovery = plan.boundary_recovery_lens[:B].cpu().long()
    out: list[int] = []
    for b in range(B):
        if n[b] > 0 and slots[b] > NULL_ID and rows[b] >= 0:
            for s, ok in ((int(final[b]), True), (int(boundary[b]), 1 <= recovery[b] <= n[b])):
                if s > NULL_ID and ok and s not in out:
                    out.append(s)
    return torch.tensor(out, dtype=torch.int64)


def states_at(pool, slots) -> dict[str, Any]:
    """``slots`` (int32) and the states ``pool`` holds there, as an op's expected results."""
    import torch

    return {"slots": slots.to(torch.int32), "states": pool[slots.to(pool.device)]}


def place_states(e: Mapping[str, Any], bufs) -> None:
    """Set the slots ``e["slots"]`` names to ``e["states"]``, where ``e`` holds both."""
    if "states" in e and "slots" in e:
        dev = bufs.pool.device
        bufs.pool[e["slots"].long().to(dev)] = e["states"].to(dev)


def copy_pending(e: Mapping[str, Any], bufs) -> None:
    """Set the pending counts to ``e["pending"]``, where ``e`` holds it."""
    if "pending" in e:
        bufs.pending.copy_(e["pending"].to(bufs.pool.device))


def written_states(outcome: Outcome) -> Located:
    """The states at the slots an op wrote (named by its expected ``slots``)."""
    written, row_of = outcome.written()
    pool = outcome.bufs.pool

    def locate_state(i):
        slot = int(written[i[0]])
        return {"batch_row": row_of(slot), "slot": slot, "head": i[1], "v": i[2], "k": i[3]}
    return pool[written.to(pool.device)], None, locate_state


def pending_counts(outcome: Outcome) -> Located:
    """Every record row's pending count."""
    return outcome.bufs.pending, None, lambda i: {"record_row": i[0]}


def plan_rows(role: str, outcome: Outcome) -> Located:
    """Plan column ``role``'s first rows, one a batch row."""
    slots = outcome.slots
    return (getattr(outcome.bufs.plan, role)[:slots.shape[0]], None,
            lambda i: {"batch_row": i[0], "slot": int(slots[i[0]])})


def record_lane(role: str, j: int, K: int) -> dict[str, Any]:
    """Coordinates of lane ``j`` of a record of ``role``: a correction's ``v``, a key/gate
    record's part and ``k``."""
    if role == "records.correction":
        return {"v": j}
    return {"part": "key" if j < K else "gate", "k": j % K}
