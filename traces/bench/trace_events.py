"""The trace runner: each recorded call of a trace timed from the buffers just before it
(``write`` events are applied untimed).

The buffers evolve under the implementation as in a replay, are restored to their contents
just before the event before every sample, and a sample is one call. Bytes come from the
event's own indices and the plan and pending counts before it (``event_bytes``).
"""

from __future__ import annotations

from datetime import datetime, timezone
from types import ModuleType
from typing import Callable

import torch

from traces.bench import timers
from traces.bench.config import BenchConfig
from traces.bench.contract_bytes import Shape, event_bytes
from traces.bench.designs import under_forced_designs
from traces.bench.results import SMOKE_LABEL, BenchRun, Row
from traces.bench.runner import finished_rows, impl_routes, start_run, timing_record
from traces.format.schema import PLAN_FIELDS
from traces.ops.table import OPS
from traces.replay.buffers import trace_buffers
from traces.replay.play import event_call


class TraceState:
    """A trace's buffers on ``device``, evolving under ``impl``'s ops, and each event's call."""

    def __init__(self, trace, impl: ModuleType, device: str):
        m = trace.manifest
        self.trace, self.impl, self.device, self.T, self.lower_bound = trace, impl, device, m.dims.T, m.lower_bound
        self.bufs = trace_buffers(trace, impl, device)
        self.buffers = self.bufs.as_roles()

    def snapshot(self) -> dict[str, torch.Tensor]:
        return {role: t.clone() for role, t in self.buffers.items()}

    def restore(self, snap: dict[str, torch.Tensor]) -> None:
        for role, t in self.buffers.items():
            t.copy_(snap[role])

    def call(self, op: str, x: dict[str, torch.Tensor], attrs: dict) -> Callable[[], None]:
        """The event's call on the evolving buffers; a verify writes into a fresh output."""
        like = OPS[op].out_like
        out = torch.zeros_like(x[like]) if like is not None else None
        return event_call(self.impl, op, x, attrs, self.bufs, self.T, self.lower_bound, out=out)


@under_forced_designs
def run_trace_bench(trace, config: BenchConfig, device: str,
                    progress: Callable[[str], None] = lambda _: None) -> BenchRun:
    """Time each event of an opened trace (``traces.format.io.read_trace``) through each implementation.

    The buffers evolve under each implementation as in a replay. Before every sample of
    event ``i`` they are restored to their contents just before ``i`` (untimed, then L2 is
    flushed); after timing, the event runs once more from there to advance the buffers. A
    sample is one call (``n_sets`` = 1). An event that fails leaves the rest of that
    implementation's events untimed.
    """
    from traces.format.provenance import environment

    m = trace.manifest
    act, state = getattr(torch, m.activation_dtype), getattr(torch, m.state_dtype)
    shape = Shape(m.dims.H, m.dims.K, m.dims.V, act.itemsize, state.itemsize)
    impls, cuda, mode, call_mode, timer, ceiling = start_run(config, device, progress)
    index_roles = ("query_start_loc", "state_indices", "record_indices", "record_rows", "block_table", "eager")
    rows: list[Row] = []
    try:
        for spec, impl in impls.items():
            broken, st = None, None
            try:
                st = TraceState(trace, impl, device)
            except (RuntimeError, ValueError, TypeError) as exc:
                broken = f"trace set-up failed: {type(exc).__name__}: {exc}"
            for i, event in enumerate(trace.events):
                if OPS[event.op].api is None:  # not a kernel call (the engine's own writes): applied, not timed
                    if broken is None:
                        x = {role: t.to(device) for role, t in trace.tensors(event.inputs).items()}
                        st.call(event.op, x, event.attrs)()
                    continue
                host = {role: trace.tensor(name).tolist() for role, name in event.inputs.items() if role in index_roles}
                row = Row(spec, event.op, len(host["state_indices"]), m.dims.T, mode, 1, 0, None, None, None, 0, 0,
                          event=i)
                rows.append(row)
                if broken is not None:
                    row.error = broken
                    continue
                snap = st.snapshot()
                plan = {f: snap[f"plan.{f}"].tolist() for f in PLAN_FIELDS}
                row.bytes, row.committed_tokens = event_bytes(event.op, shape, m.dims.T, host, plan,
                                                              snap["pending"].tolist())
                progress(f"{spec} event {i} {event.op} B={row.batch}")
                try:
                    x = {role: t.to(device) for role, t in trace.tensors(event.inputs).items()}
                    call = st.call(event.op, x, event.attrs)
                    times = timers.time_calls(call, lambda: st.restore(snap), 1, timer, config, call_mode)
                    timers.fill_times(row, times, ceiling)
                    st.restore(snap)
                    call()
                except Exception as exc:  # the buffers can no longer follow the trace
                    row.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
                    progress(f"{spec} event {i} {event.op}: {row.error}")
                    broken = f"not timed: event {i} failed"
            st = None
            if cuda:
                torch.cuda.empty_cache()
    except KeyboardInterrupt:
        rows = finished_rows(rows)
        interrupted = True
    else:
        interrupted = False
    workload = {
        "trace": str(trace.path), "events": len(trace.events), "heads": m.dims.H, "head_k_dim": m.dims.K,
        "head_v_dim": m.dims.V, "spec_lens": [m.dims.T], "activation_dtype": m.activation_dtype,
        "state_dtype": m.state_dtype, "lower_bound": m.lower_bound, "impls": list(config.impls),
        "routes": impl_routes(impls),
    }
    timing = {**timing_record(config, mode, timer), "method": (
        "per event and sample, untimed: restore every buffer to its contents before the event, read a scratch "
        "buffer of >= 4x L2 (eager: then synchronise); timed with CUDA events: one graph replay (or eager call) "
        "of the event's one call")}
    return BenchRun(workload=workload, timing=timing, environment=environment(), copy_ceiling=ceiling, rows=rows,
                    label=SMOKE_LABEL if config.smoke else None, interrupted=interrupted,
                    created=datetime.now(timezone.utc).isoformat(timespec="seconds"))
