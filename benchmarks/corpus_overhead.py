"""The local pool's cost per trace: ``kda replay CORPUS --workers 1`` against a plain loop.

usage: python3 benchmarks/corpus_overhead.py [--traces 50] [--impl triton] [--folder DIR]

Builds a corpus of small K3-shaped traces (k3-tp8: H=12, K=V=128, T=8; 4 requests, at most 3
decode steps each; 5 synthesised, copied up to ``--traces``) in ``--folder`` (a temporary
folder by default) and replays the 5 once to warm Triton's disk cache. Then it times the
traces past the first 5 three ways: in a loop in this process
(``traces.corpus.run.replay_one``), through ``traces.corpus.pool.run_pool`` with one worker
(from the arrival of the 5th result to the last: the worker's start-up, once a run, is quoted
apart), and in a loop in a spawned child set up as a worker (no pipe between traces). The
pool's time less the loop's, per trace, is the pool's steady cost, quoted as a share of a
trace's replay. The median replay time each result reports (measured inside the process
that replayed it) tells whether that cost lies inside the worker's replays or between them.
``--profile DIR`` writes cProfile tables (cumulative time, top 40) of the parent's loop and
of the child's. Exit status 0 when every replay passed. On a machine without CUDA it runs
through the Triton interpreter (use ``--impl reference`` and few traces there: a smoke run,
no timing).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import multiprocessing
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kda_cli.runtime import select_device  # noqa: E402

DISTINCT = 5
"""Traces synthesised; the others are copies (the replay reads every file anyway)."""


def build_corpus(folder: Path, count: int) -> list[Path]:
    from traces.synth.simulation import synthesize
    from traces.synth.config import SynthConfig

    sources = []
    for seed in range(min(DISTINCT, count)):
        path = folder / f"k3-small-{seed:03d}.safetensors"
        synthesize(SynthConfig(preset="k3-tp8", requests=4, max_batch=4, max_decode_steps=3, seed=seed)).write(path)
        sources.append(path)
    for i in range(len(sources), count):
        shutil.copy(sources[i % len(sources)], folder / f"k3-small-{i:03d}.safetensors")
    return sorted(folder.glob("*.safetensors"))


def profiled(fn, out: Path | None, name: str):
    """``fn()``; with ``out``, under cProfile, its table written to ``out/name``."""
    if out is None:
        return fn()
    profile = cProfile.Profile()
    value = profile.runcall(fn)
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(40)
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(text.getvalue())
    return value


def child_loop(traces: list[Path], settings, device: str, profile: Path | None, conn) -> None:
    """A spawned process set up as a pool worker is (``prepare_process``) replaying every trace
    in a loop with no pipe between traces; sends back (wall seconds, each result's seconds)."""
    from traces.corpus.run import prepare_process, replay_one

    prepare_process(device)
    [replay_one(t, settings, device) for t in traces[:DISTINCT]]  # load the kernels, as the pool's first traces do
    began = time.perf_counter()
    results = profiled(lambda: [replay_one(t, settings, device) for t in traces], profile, "profile-child-loop.txt")
    conn.send((time.perf_counter() - began, [r.seconds for r in results]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=50)
    parser.add_argument("--impl", default="triton")
    parser.add_argument("--folder", type=Path, default=None)
    parser.add_argument("--profile", type=Path, default=None)
    args = parser.parse_args()
    device = select_device()
    from traces.corpus.run import ReplaySettings, replay_one
    from traces.corpus.pool import run_pool

    with tempfile.TemporaryDirectory(prefix="kda-corpus-") as scratch:
        folder = args.folder or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        traces = build_corpus(folder, args.traces)
        settings = ReplaySettings(args.impl)
        warm = [replay_one(t, settings, device) for t in traces[:DISTINCT]]  # compiles into Triton's disk cache

        def timed(fn):
            began = time.perf_counter()
            value = fn()
            return value, time.perf_counter() - began

        rest = traces[DISTINCT:]
        loop, loop_rest = timed(lambda: profiled(lambda: [replay_one(t, settings, device) for t in rest],
                                                 args.profile, "profile-parent-loop.txt"))
        arrivals: list[float] = []
        began = time.perf_counter()
        run = run_pool(traces, settings, device=device, workers=1,
                       on_result=lambda _: arrivals.append(time.perf_counter()))
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        child = context.Process(target=child_loop, args=(rest, settings, device, args.profile, theirs))
        child.start()
        child_rest, child_seconds = ours.recv()
        child.join()

    n = len(rest)
    per_trace = statistics.median(r.seconds for r in loop)
    pool_rest = arrivals[-1] - arrivals[DISTINCT - 1]
    steady = (pool_rest - loop_rest) / max(n, 1)
    print(f"{len(traces)} traces, impl {args.impl} on {device}; a trace's replay: median {per_trace * 1e3:.1f} ms")
    print(f"the pool's first {DISTINCT} results took {arrivals[DISTINCT - 1] - began:.2f} s (the worker's start-up: "
          f"spawn, imports, CUDA context, each kernel loaded once)")
    print(f"the {n} traces after them: loop in this process {loop_rest:.2f} s, pool (1 worker) {pool_rest:.2f} s, "
          f"loop in a spawned child {child_rest:.2f} s")
    print(f"pool overhead per trace past start-up: {steady * 1e3:.2f} ms ({steady / per_trace:.1%} of a replay)")
    inside = {"loop in this process": [r.seconds for r in loop],
              "pool worker": [r.seconds for r in run.results[DISTINCT:]], "loop in a spawned child": child_seconds}
    print("a trace's replay as its result reports it (median ms): " +
          ", ".join(f"{k} {statistics.median(v) * 1e3:.1f}" for k, v in inside.items()))
    outcomes = [r.outcome for r in warm + loop + run.results]
    if any(o != "passed" for o in outcomes) or len(run.results) != len(traces):
        print(f"not every replay passed: {sorted(set(outcomes))}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
