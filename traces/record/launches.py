"""The events of the documented raw kernels' launches (``RAW_KERNELS``), as a patched module
makes them (``traces.record.patch``): a ``_defer_commit_kernel`` launch is a defer event
(``record_defer``); a ``_prepare_flush_plan_kernel`` launch starts a flush event that the next
commit of that plan and those rows (the commit half of the flush) completes
(``FlushPairing``).

Each takes the launch's arguments by their documented names (``p``), its rows ``B`` (the
grid) and its state indices as a tensor, and records into a
``traces.record.events.Recording`` on the layer already selected.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from traces.format.schema import PLAN_FIELDS
from traces.record.events import Recording
from traces.record.program_call import ProgramCall
from traces.record.recorder import written_slots
from traces.ops.table import op_name

RAW_KERNELS = {
    "_defer_commit_kernel": ("state_indices_ptr", "commit_lens_ptr", "record_rows_ptr", "pending_ptr", "eager_ptr",
                             "null_block_id", "stride_state_indices"),
    "_prepare_flush_plan_kernel": ("state_indices_ptr", "record_rows_ptr", "pending_ptr", "commit_lens_ptr",
                                   "final_state_indices_ptr", "boundary_state_indices_ptr",
                                   "boundary_recovery_lens_ptr", "null_block_id", "stride_state_indices",
                                   "SPEC_QUERY_LEN"),
}
"""Documented raw kernels -> their documented parameters, in order."""


def plan_column(recording: Recording, field: str, t: torch.Tensor) -> torch.Tensor:
    """The bound plan column that ``t`` starts (an engine may pass its first B rows)."""
    bound = recording.bound.get(f"plan.{field}")
    if bound is not None and bound.data_ptr() == t.data_ptr() and bound.numel() >= t.numel():
        return bound
    return t


def record_defer(recording: Recording, call: ProgramCall, B: int, state_indices: torch.Tensor, p: dict):
    """A ``_defer_commit_kernel`` launch: a defer event, when the recording accepts its buffers."""
    commit_lens, pending, eager = plan_column(recording, "commit_lens", p["commit_lens_ptr"]), p["pending_ptr"], \
        p["eager_ptr"]
    bind = {"plan.commit_lens": commit_lens, "pending": pending}
    if not recording.accepts(op_name.defer, bind, None, None, lower_bound_used=False):
        return call()
    inputs = {"state_indices": state_indices, "record_rows": p["record_rows_ptr"][:B],
              "eager": None if eager is None else eager[:B]}
    event = recording.begin(op_name.defer, inputs, {}, None, None, bind)
    result = recording.call(event, call)
    recording.end(event, {"pending": pending, "commit_lens": commit_lens[:B]})
    return result


class FlushPairing:
    """A flush plan launched and the commit that completes it: one flush event of
    ``recording``, written when the commit comes, with the pending counts and plan columns as
    they were before the launch."""

    def __init__(self, recording: Recording):
        self.recording = recording
        self._flush: dict[str, Any] | None = None  # a flush plan launched, its commit not yet seen

    @property
    def waiting(self) -> bool:
        """Whether a flush plan was launched whose commit has not come yet."""
        return self._flush is not None

    def start(self, call: ProgramCall, B: int, state_indices: torch.Tensor, p: dict):
        """A ``_prepare_flush_plan_kernel`` launch: run it; the event is written when its commit
        comes (``finish``), with ``pending`` as it was before this launch."""
        recording = self.recording
        plan = {f: plan_column(recording, f, p[f"{f}_ptr"]) for f in PLAN_FIELDS}
        bind = {**{f"plan.{f}": t for f, t in plan.items()}, "pending": p["pending_ptr"]}
        if not recording.accepts(op_name.flush, bind, None, None, lower_bound_used=False):
            return call()
        before = {"pending": p["pending_ptr"].clone(), **{f"plan.{f}": t.clone() for f, t in plan.items()}}
        result = call()
        self._flush = {"state_indices": state_indices, "record_rows": p["record_rows_ptr"][:B], "plan": plan,
                       "pending": p["pending_ptr"], "before": before}
        return result

    def drop(self) -> None:
        """A flush plan whose commit never came: not an event (counted)."""
        if self._flush is not None:
            self._flush = None
            self.recording.skip("flush_plan_without_commit")

    def finish(self, run: ProgramCall, a: dict[str, Any], commit: Callable[..., Any]):
        """The commit after a flush plan (``run``: the program's commit call, ``a`` its
        arguments by kda's names): one flush event over both, when it commits that plan for
        those rows; else the flush plan is dropped (counted) and the commit recorded as one
        (``commit(**a)``)."""
        flush, self._flush = self._flush, None
        recording = self.recording
        plan = a["plan"]
        rows = a.get("record_indices")
        same = (rows is not None and plan.commit_lens.data_ptr() == flush["plan"]["commit_lens"].data_ptr()
                and torch.equal(rows[: flush["record_rows"].shape[0]].cpu(), flush["record_rows"].cpu())
                and torch.equal(a["state_indices"].cpu(), flush["state_indices"].cpu()))
        if not same:
            recording.skip("flush_plan_without_commit")
            return commit(**a)
        pool, records, pending = a["checkpoint_state"], a["records"], flush["pending"]
        bind = {"checkpoint_state": pool, "records.correction": records.correction,
                "records.key_gate": records.key_gate, "A_log": a["A_log"], "dt_bias": a["dt_bias"],
                **{f"plan.{f}": t for f, t in flush["plan"].items()}, "pending": pending}
        if not recording.accepts(op_name.flush, bind, a["lower_bound"], None):
            return run()
        # the event begins where the flush plan launch did: its snapshots and writes see the
        # counts and plan columns from before it (a kernel that consumes counts shows as one)
        after = {role: bind[role].clone() for role in flush["before"]}
        for role, t in flush["before"].items():
            bind[role].copy_(t)
        try:
            event = recording.begin(op_name.flush, {"state_indices": flush["state_indices"],
                                              "record_rows": flush["record_rows"]}, {"consume_pending": False},
                                    flush["state_indices"], flush["record_rows"], bind, (a["lower_bound"],))
        finally:
            for role, t in after.items():
                bind[role].copy_(t)
        result = recording.call(event, run)
        slots = written_slots(plan, flush["state_indices"], flush["record_rows"])
        recording.end(event, {"slots": slots.to(torch.int32), "states": pool[slots.to(pool.device)],
                              "pending": pending})
        return result


__all__ = ["RAW_KERNELS", "FlushPairing", "plan_column", "record_defer"]
