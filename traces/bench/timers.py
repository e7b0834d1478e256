"""Timing: CUDA-event and wall-clock timers, percentiles, the copy ceiling, and the
per-row sampling loop both runners use.

In ``graph`` mode each row gets one CUDA graph capturing one sample (``capture``); in
``eager`` mode the same Python calls are issued directly. Before every sample, outside the
timed region: the consumed buffers are restored (the state pool for ops that write it, the
plan columns and pending counts), and a scratch buffer of at least four times the L2 size
is read, which evicts the restored state from L2 and leaves only clean lines (no write-back
in the timed region). Eager samples then synchronise the device, so launch overhead is
measured; graph samples do not, so the graph's host-side launch overlaps the flush, as it
overlaps earlier work in a real decode step. A sample is the time between two CUDA events
around the replay (or the eager calls), divided by the calls it makes. A device-to-device
copy of a large buffer (bytes read plus written over its median time) is measured in the
same run, and every row's GB/s is also given as a fraction of it.
"""

from __future__ import annotations

import math
import time
from typing import Callable

import torch

from traces.bench.capture import warm_and_capture

COPY_CEILING_BYTES = 2**30
MIN_REPS = 10
"""Fewest samples of a measured row, whatever its time budget."""
SMOKE_REPS = 2
"""Samples per smoke row: the fewest that run an op again after its restore."""


class CudaTimer:
    """CUDA-event timing. Before each sample, untimed: ``prepare``, then an L2 flush that reads
    a scratch buffer of at least four L2 sizes (a read leaves only clean lines, so no
    write-back spills into the timed region), then, for eager calls only, a device
    synchronisation so that launch overhead is measured and not hidden behind the flush."""

    def __init__(self, device: str):
        props = torch.cuda.get_device_properties(device)
        self.l2_bytes = int(getattr(props, "L2_cache_size", 60 * 2**20))
        self.scratch = torch.zeros(max(4 * self.l2_bytes, 256 * 2**20), dtype=torch.uint8, device=device)

    def samples(self, fn: Callable[[], None], prepare: Callable[[], None], reps: int, synchronize: bool) -> list[float]:
        """Seconds of ``fn`` per sample, between two CUDA events on the current stream."""
        events = []
        for _ in range(reps):
            prepare()
            self.scratch.sum()
            if synchronize:
                torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
        return [start.elapsed_time(end) * 1e-3 for start, end in events]


class WallTimer:
    """Wall-clock timing for smoke runs on the CPU (nothing to flush or synchronise)."""

    l2_bytes = 0

    def samples(self, fn: Callable[[], None], prepare: Callable[[], None], reps: int, synchronize: bool) -> list[float]:
        times = []
        for _ in range(reps):
            prepare()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return times


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated ``q``-th percentile (0..100) of a non-empty list."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def measure_copy_ceiling(device: str, nbytes: int = COPY_CEILING_BYTES, reps: int = 20) -> dict:
    """Median time of a device-to-device copy of ``nbytes``; GB/s counts bytes read plus written."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    events = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) * 1e-3 for s, e in events]
    median = percentile(times, 50)
    del src, dst
    torch.cuda.empty_cache()
    return {"bytes": 2 * nbytes, "median_us": median * 1e6, "gbps": 2 * nbytes / median / 1e9, "count": reps}


def time_calls(run: Callable[[], None], restore: Callable[[], None], calls: int, timer, config,
               mode: str) -> list[float]:
    """Per-call seconds of each sample of ``run`` (which makes ``calls`` calls); ``restore``
    runs untimed before every sample. ``mode`` is ``graph`` or ``eager``; ``config`` is the
    run's ``BenchConfig`` (its reps, row budget and smoke flag)."""
    if mode == "graph":
        fn = warm_and_capture(run, restore).replay
    else:
        fn = run
        restore()
        fn()
    if config.smoke:
        reps = SMOKE_REPS
    else:
        t0 = time.perf_counter()
        timer.samples(fn, restore, 1, mode == "eager")
        estimate = time.perf_counter() - t0
        reps = max(min(config.reps, MIN_REPS), min(config.reps, int(config.row_seconds / max(estimate, 1e-9))))
    return [t / calls for t in timer.samples(fn, restore, reps, mode == "eager")]


def fill_times(row, times: list[float], ceiling: dict | None) -> None:
    """Set a ``Row``'s count and percentiles (microseconds) from per-call ``times`` in seconds,
    and its GB/s and copy fraction when a ``ceiling`` was measured."""
    row.count = len(times)
    row.median_us, row.p10_us, row.p90_us = (percentile(times, q) * 1e6 for q in (50, 10, 90))
    if ceiling is not None:
        row.gbps = row.bytes / (row.median_us * 1e-6) / 1e9
        row.copy_fraction = row.gbps / ceiling["gbps"]
