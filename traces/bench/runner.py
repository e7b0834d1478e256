"""What both bench runners share: loading the implementations, choosing the timer and the
call mode, the copy ceiling, and the record of how a run was timed."""

from __future__ import annotations

from typing import Callable

from traces.bench.config import BenchConfig
from traces.bench.results import Row
from traces.bench.timers import CudaTimer, WallTimer, measure_copy_ceiling


def start_run(config: BenchConfig, device: str, progress: Callable[[str], None]):
    """Load the implementations; pick the timer and the call mode; measure the copy ceiling."""
    from traces.impl.loader import load_impl

    impls = {spec: load_impl(spec) for spec in config.impls}
    cuda = device.startswith("cuda")
    mode = "smoke" if config.smoke else config.mode
    call_mode = "graph" if mode == "graph" and cuda else "eager"
    timer = CudaTimer(device) if cuda else WallTimer()
    ceiling = None
    if cuda and not config.smoke:
        progress("measuring the device-to-device copy ceiling")
        ceiling = measure_copy_ceiling(device)
    return impls, cuda, mode, call_mode, timer, ceiling


def impl_routes(impls: dict, ops: tuple[str, ...] = ()) -> dict[str, dict[str, str]]:
    """Per implementation spec: op -> the implementation it runs through
    (``traces.impl.loader.op_routes``), and with ``commit-context`` among ``ops``, the commit
    context it runs."""
    from traces.impl.loader import op_routes
    from traces.replay.commit_context import commit_context_type

    routes = {spec: op_routes(impl, spec) for spec, impl in impls.items()}
    if "commit-context" in ops:
        for spec, impl in impls.items():
            routes[spec]["commit-context"] = commit_context_type(impl, spec)[1]
    return routes


def timing_record(config: BenchConfig, mode: str, timer) -> dict:
    """How a run was timed, as saved with it (the preset sweep's method; a trace run replaces ``method``)."""
    return {
        "mode": mode, "max_reps": config.reps, "row_seconds": config.row_seconds,
        "touch_bytes": config.touch_bytes, "l2_bytes": timer.l2_bytes,
        "method": "per sample, untimed: restore consumed buffers (state pool, pending, plan), read a scratch "
                  "buffer of >= 4x L2 (eager: then synchronise); timed with CUDA events: one graph replay "
                  "(or the eager calls) over n_sets disjoint sets; reported per call (divided by n_sets)",
    }


def finished_rows(rows: list[Row]) -> list[Row]:
    """The rows of an interrupted run that were timed or failed, not the one in flight."""
    return [r for r in rows if r.median_us is not None or r.error is not None]
