"""Benchmark engine for the RecoverSSM ops and whole decode steps, as a library.

One job per module:

- ``contract_bytes``: bytes per call of each op, step and trace event, from the contract (an
  op's own, ``verify_bytes`` and the like, from its module in ``traces.ops``);
- ``config``: presets and ``BenchConfig`` (no torch: the command line checks options with it);
- ``workload``: the ``n_sets`` disjoint decode layers a sample runs;
- ``timers``: CUDA-event and wall-clock timers, the copy ceiling, the per-row sampling loop;
- ``capture``: CUDA graph capture, with Ctrl-C and SIGTERM held while a capture runs;
- ``runner``: what both runners share (implementations, timer, ceiling, timing record);
- ``designs``: the designs a run forces (``KDA_DESIGN`` while it times, recorded with it);
- ``sweep``: the preset sweep (``run_bench``);
- ``trace_events``: each event of a recorded trace timed (``run_trace_bench``);
- ``results``: rows and runs, ratios, save, load, compare, plot.

The names below are the package's public surface (``benchmarks/`` scripts import them from
here); each is loaded with its module (``traces.bench``'s, or the one named in full) on first
use, so importing the package costs nothing.
"""

from importlib import import_module

_PUBLIC = {
    "capture": ("SyncError", "interrupts_held", "warm_and_capture"),
    "config": ("ACCEPT_MODES", "DEFAULT_TOUCH_BYTES", "MODES", "OPS", "PRESETS", "BenchConfig", "Preset"),
    "designs": ("forced_designs", "under_forced_designs"),
    "contract_bytes": ("STEPS", "Shape", "event_bytes", "flush_verify_bytes", "op_bytes"),
    "traces.ops.commit": ("commit_bytes",),
    "traces.ops.defer": ("defer_bytes",),
    "traces.ops.flush": ("flush_bytes",),
    "traces.ops.plan": ("plan_bytes",),
    "traces.ops.verify": ("verify_bytes",),
    "results": ("SCHEMA", "SMOKE_LABEL", "BenchRun", "Comparison", "Row", "compare_runs", "impl_ratios", "load_run",
                "plot_run", "save_run"),
    "sweep": ("run_bench",),
    "timers": ("COPY_CEILING_BYTES", "CudaTimer", "WallTimer", "measure_copy_ceiling", "percentile"),
    "trace_events": ("TraceState", "run_trace_bench"),
    "workload": ("STATE_DTYPES", "Workload", "accepted_counts", "choose_sets", "set_bytes"),
}
_MODULE_OF = {name: module for module, names in _PUBLIC.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'traces.bench' has no attribute {name!r}")
    module = _MODULE_OF[name]
    value = getattr(import_module(module if "." in module else f"traces.bench.{module}"), name)
    globals()[name] = value
    return value
