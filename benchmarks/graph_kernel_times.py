"""Per-kernel times inside CUDA-graph replays of `kda bench` ops and steps, on the GPU.

Kernel start and end times come from CUPTI, through torch.profiler.

usage: python3 benchmarks/graph_kernel_times.py [--impl triton] [--case T:B ...]
       [--ops verify,commit,step-stock,step-deferred] [--preset k3-tp8]

Each case builds the bench's workload (``traces.bench.Workload``: as many disjoint sets as
`kda bench` takes at its default ``--touch-mb``, all drafts accepted, fp32 state), captures
each op in a CUDA graph as `kda bench` does, replays it 6 times under the profiler (state
restored and the L2 flushed, by the bench timer's scratch read, before each replay) and
prints, per kernel (name, grid, registers per thread), medians in microseconds:

- ``dur``: its own start to end (under dependent launch this includes waiting for the
  kernel ahead, which it may start beside);
- ``adds``: its end minus the end of the kernel before it, what it adds to the chain;
- ``start gap``: its start minus the end of the kernel before it (negative: it overlaps).

``span`` is a replay's first start to last end, over the sets in it. The profiler's own
overhead makes spans a little longer than `kda bench` medians; compare kernels, not totals.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from traces.bench import (  # noqa: E402
    DEFAULT_TOUCH_BYTES, PRESETS, CudaTimer, Shape, Workload, choose_sets, set_bytes, warm_and_capture,
)
from traces.impl.loader import load_impl  # noqa: E402

REPLAYS = 6


def _replay_kernels(trace_path: str) -> list[list[tuple[float, float, str]]]:
    """The profiled kernels, ``(start, end, label)`` in microseconds, one list per replay
    (replays are apart by more than 20 us of idle time)."""
    kernels = []
    for event in json.load(open(trace_path))["traceEvents"]:
        if event.get("cat") == "kernel" and event["name"].startswith("_"):  # Triton's, not torch's
            args = event.get("args", {})
            label = f"{event['name']}{tuple(args.get('grid', ()))}r{args.get('registers per thread', '?')}"
            kernels.append((event["ts"], event["ts"] + event["dur"], label))
    kernels.sort()
    replays, current = [], []
    for kernel in kernels:
        if current and kernel[0] - current[-1][1] > 20:
            replays.append(current)
            current = []
        current.append(kernel)
    return replays + [current] if current else replays


def profile_op(work: Workload, name: str, timer: CudaTimer, case: str) -> None:
    """Profile ``REPLAYS`` graph replays of op or step ``name`` and print its kernels."""
    graph = warm_and_capture(lambda: work.run(name), lambda: work.restore(name))
    for _ in range(3):
        work.restore(name)
        timer.scratch.sum()
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPLAYS):
            work.restore(name)
            timer.scratch.sum()
            graph.replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        replays = _replay_kernels(path)
    dur, adds, gaps = (collections.defaultdict(list) for _ in range(3))
    spans = []
    for replay in replays:
        spans.append((replay[-1][1] - replay[0][0]) / work.n_sets)
        for i, (start, end, label) in enumerate(replay):
            dur[label].append(end - start)
            if i:
                adds[label].append(end - replay[i - 1][1])
                gaps[label].append(start - replay[i - 1][1])
    med = statistics.median
    print(f"== {name} T:B={case}: {len(replays)} replays of {work.n_sets} sets, span per set {med(spans):.2f} us")
    for label in dur:
        print(f"   {label:52s} dur {med(dur[label]):7.2f}  adds {med(adds[label]) if adds[label] else 0:7.2f}"
              f"  start gap {med(gaps[label]) if gaps[label] else 0:7.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="triton", help="triton, or a module or file with the kernels' API")
    parser.add_argument("--case", nargs="+", default=["8:256"], help="T:B pairs (default 8:256)")
    parser.add_argument("--ops", default="verify,commit,step-stock,step-deferred")
    parser.add_argument("--preset", default="k3-tp8", choices=sorted(PRESETS))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("graph_kernel_times: needs a CUDA device", file=sys.stderr)
        return 2
    impl = load_impl(args.impl)
    preset = PRESETS[args.preset]
    timer = CudaTimer("cuda")
    state_dtype = torch.float32
    slot_bytes = Shape(preset.heads, preset.head_k_dim, preset.head_v_dim,
                       getattr(torch, preset.activation_dtype).itemsize, state_dtype.itemsize).slot_bytes
    for case in args.case:
        T, B = (int(x) for x in case.split(":"))
        n_sets = choose_sets(slot_bytes, B, DEFAULT_TOUCH_BYTES, set_bytes(preset, state_dtype, B, T),
                             torch.cuda.mem_get_info()[0])
        work = Workload(impl, preset, state_dtype, B, T, [T] * B, n_sets, "cuda", 0)
        for name in args.ops.split(","):
            profile_op(work, name, timer, case)
        del work
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
