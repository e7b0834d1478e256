"""Benchmark engine for the RecoverSSM ops and whole decode steps, as a library.

One job per module:

- ``contract_bytes``: bytes per call of each op, step and trace event, from the contract;
- ``workload``: presets, ``BenchConfig`` and the ``n_sets`` disjoint decode layers a sample runs;
- ``timers``: CUDA-event and wall-clock timers, the copy ceiling, the per-row sampling loop;
- ``capture``: CUDA graph capture, with Ctrl-C and SIGTERM held while a capture runs;
- ``runner``: what both runners share (implementations, timer, ceiling, timing record);
- ``sweep``: the preset sweep (``run_bench``);
- ``trace_events``: each event of a recorded trace timed (``run_trace_bench``);
- ``results``: rows and runs, ratios, save, load, compare, plot.

The names below are the package's public surface; ``benchmarks/`` scripts import them from here.
"""

from traces.bench.capture import SyncError, interrupts_held, warm_and_capture
from traces.bench.contract_bytes import (
    STEPS, Shape, commit_bytes, defer_bytes, event_bytes, flush_bytes, flush_verify_bytes, op_bytes, plan_bytes,
    verify_bytes,
)
from traces.bench.results import (
    SCHEMA, SMOKE_LABEL, BenchRun, Comparison, Row, compare_runs, impl_ratios, load_run, plot_run, save_run,
)
from traces.bench.sweep import run_bench
from traces.bench.timers import COPY_CEILING_BYTES, CudaTimer, WallTimer, measure_copy_ceiling, percentile
from traces.bench.trace_events import TraceState, run_trace_bench
from traces.bench.workload import (
    ACCEPT_MODES, DEFAULT_TOUCH_BYTES, MODES, OPS, PRESETS, STATE_DTYPES, BenchConfig, Preset, Workload,
    accepted_counts, choose_sets, set_bytes,
)

__all__ = [
    "ACCEPT_MODES", "COPY_CEILING_BYTES", "DEFAULT_TOUCH_BYTES", "MODES", "OPS", "PRESETS", "SCHEMA", "SMOKE_LABEL",
    "STATE_DTYPES", "STEPS", "BenchConfig", "BenchRun", "Comparison", "CudaTimer", "Preset", "Row", "Shape",
    "SyncError", "TraceState", "WallTimer", "Workload", "accepted_counts", "choose_sets", "commit_bytes",
    "compare_runs", "defer_bytes", "event_bytes", "flush_bytes", "flush_verify_bytes", "impl_ratios",
    "interrupts_held", "load_run", "measure_copy_ceiling", "op_bytes", "percentile", "plan_bytes", "plot_run",
    "run_bench", "run_trace_bench", "save_run", "set_bytes", "verify_bytes", "warm_and_capture",
]
