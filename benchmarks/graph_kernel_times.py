"""Per-kernel times inside CUDA-graph replays of `kda bench` ops and steps, on the GPU.

Kernel start and end times come from CUPTI, through torch.profiler.

usage: python3 benchmarks/graph_kernel_times.py [--impl triton] [--case T:B ...]
       [--ops verify,commit,step-stock,step-deferred] [--preset k3-tp8]

Each case builds the bench's workload (``traces.bench.Workload``: 32 disjoint layers, all
drafts accepted, fp32 state), captures each op in a CUDA graph as `kda bench` does, replays
it 6 times under the profiler (state restored and the L2 flushed before each replay) and
prints, per kernel (name, grid, registers per thread), medians in microseconds:

- ``dur``: its own start to end (under dependent launch this includes waiting for the
  kernel ahead, which it may start beside);
- ``adds``: its end minus the end of the kernel before it, what it adds to the chain;
- ``start gap``: its start minus the end of the kernel before it (negative: it overlaps).

``span`` is a replay's first start to last end over the layers in it. The profiler's own
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

from traces.bench import PRESETS, Workload, warm_and_capture  # noqa: E402
from traces.impl import load_impl  # noqa: E402

LAYERS = 32
REPLAYS = 6
_L2_FLUSH_BYTES = 512 * 2**20


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


def profile_op(work: Workload, name: str, flush: torch.Tensor, case: str) -> None:
    """Profile ``REPLAYS`` graph replays of op or step ``name`` and print its kernels."""
    graph = warm_and_capture(lambda: work.run(name), lambda: work.restore(name))
    for _ in range(3):
        work.restore(name)
        flush.sum()
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPLAYS):
            work.restore(name)
            flush.sum()
            graph.replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        replays = _replay_kernels(path)
    dur, adds, gaps = (collections.defaultdict(list) for _ in range(3))
    spans = []
    for replay in replays:
        spans.append((replay[-1][1] - replay[0][0]) / LAYERS)
        for i, (start, end, label) in enumerate(replay):
            dur[label].append(end - start)
            if i:
                adds[label].append(end - replay[i - 1][1])
                gaps[label].append(start - replay[i - 1][1])
    med = statistics.median
    print(f"== {name} T:B={case}: {len(replays)} replays, span per layer {med(spans):.2f} us")
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
    flush = torch.zeros(_L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    for case in args.case:
        T, B = (int(x) for x in case.split(":"))
        work = Workload(impl, preset, torch.float32, B, T, [T] * B, LAYERS, "cuda", 0)
        for name in args.ops.split(","):
            profile_op(work, name, flush, case)
        del work
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
