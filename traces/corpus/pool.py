"""The local pool of a corpus replay: worker processes on this host, each pinned to a device.

Every worker is a ``spawn``ed process (no CUDA state inherited) whose environment pins it
before torch starts: ``CUDA_VISIBLE_DEVICES`` names its one GPU, or, on the CPU, the Triton
interpreter. It takes one trace at a time and sends back its ``TraceResult``. A worker that
dies under a trace (``os._exit``, a segfault, the OOM killer) makes that trace ``crashed``
and a fresh worker takes its place while traces remain. Ctrl-C or SIGTERM in the parent
(a ``KeyboardInterrupt``) kills every worker; the run so far comes back, marked interrupted.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections import deque
from multiprocessing.connection import wait
from pathlib import Path
from typing import Callable

from traces.corpus.run import CorpusRun, ReplaySettings, TraceResult, device_label, prepare_process, replay_one

STOP_SECONDS = 5.0
"""How long a worker told to stop may take to exit before it is killed."""


def worker_devices(workers: int | None, device: str) -> list[tuple[str, dict[str, str]]]:
    """(label, environment) of each worker. On CUDA: by default one per visible GPU, and
    worker ``i`` gets GPU ``i mod count`` of ``CUDA_VISIBLE_DEVICES`` (or of every GPU when it
    is unset). On the CPU: by default one per core this process may run on."""
    if device == "cuda":
        import torch

        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = ([v.strip() for v in visible.split(",") if v.strip()] if visible is not None
               else [str(i) for i in range(torch.cuda.device_count())])
        return [(f"cuda:{ids[i % len(ids)]}", {"CUDA_VISIBLE_DEVICES": ids[i % len(ids)]})
                for i in range(workers or len(ids))]
    return [(f"cpu#{i}", {"TRITON_INTERPRET": "1"}) for i in range(workers or len(os.sched_getaffinity(0)))]


def _worker(conn, env: dict[str, str], settings: ReplaySettings, device: str, label: str) -> None:
    """A worker's life: pin the device, then replay each trace the parent sends until ``None``."""
    os.environ.update(env)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches the parent, which stops us
    os.dup2(2, 1)  # an implementation's prints go to stderr: the parent's stdout carries the report
    prepare_process(device)
    while True:
        try:
            trace = conn.recv()
        except EOFError:  # the parent is gone
            return
        if trace is None:
            return
        conn.send(replay_one(trace, settings, device, worker=label).to_json())


class _Worker:
    """A worker process, the pipe to it, and the trace it is replaying."""

    def __init__(self, context, label: str, env: dict[str, str], settings: ReplaySettings, device: str):
        self.label, self.env = label, env
        self.conn, theirs = context.Pipe()
        self.process = context.Process(target=_worker, args=(theirs, env, settings, device, label), daemon=True,
                                       name=f"kda-replay {label}")
        self.process.start()
        theirs.close()
        self.trace: str | None = None
        self.began = 0.0

    def give(self, trace: str) -> None:
        self.trace, self.began = trace, time.monotonic()
        try:
            self.conn.send(trace)
        except OSError:  # it died between two traces: the wait that follows reports it under this one
            pass

    def died(self) -> TraceResult:
        """The result of the trace it was replaying when it died."""
        self.process.join(STOP_SECONDS)
        code = self.process.exitcode
        how = (f"killed by {signal.Signals(-code).name}" if code is not None and code < 0
               else f"exited with status {code}")
        return TraceResult(self.trace, "crashed", time.monotonic() - self.began,
                           f"the worker process {how} while replaying it", self.label)


def run_pool(traces: list[Path], settings: ReplaySettings, *, device: str, workers: int | None = None,
             on_result: Callable[[TraceResult], None] | None = None) -> CorpusRun:
    """Replay ``traces`` on ``device`` (``cuda`` or ``cpu``; the interpreter under ``cpu``)
    with ``workers`` processes (``worker_devices``' default when None), never more than
    traces. ``on_result`` gets each result as it comes. Returns the run; on Ctrl-C the run
    so far, with ``interrupted`` set, every worker killed."""
    slots = worker_devices(workers, device)[:len(traces)]
    run = CorpusRun([str(t) for t in traces], len(slots), device_label(device))
    waiting = deque(run.traces)
    context = multiprocessing.get_context("spawn")
    started: list[_Worker] = []
    busy: list[_Worker] = []
    began = time.monotonic()

    def finished(result: TraceResult) -> None:
        run.results.append(result)
        if on_result is not None:
            on_result(result)

    def start(label: str, env: dict[str, str]) -> None:
        if waiting:
            worker = _Worker(context, label, env, settings, device)
            started.append(worker)
            busy.append(worker)
            worker.give(waiting.popleft())

    try:
        for label, env in slots:
            start(label, env)
        while busy:
            ready = set(wait([w.conn for w in busy] + [w.process.sentinel for w in busy]))
            for worker in [w for w in busy if w.conn in ready or w.process.sentinel in ready]:
                try:
                    result = TraceResult.from_json(worker.conn.recv())
                except (EOFError, OSError):
                    busy.remove(worker)
                    finished(worker.died())
                    start(worker.label, worker.env)
                    continue
                finished(result)
                if waiting:
                    worker.give(waiting.popleft())
                else:
                    busy.remove(worker)
                    worker.conn.send(None)
    except KeyboardInterrupt:
        run.interrupted = True
    finally:
        for worker in started:
            if run.interrupted:
                worker.process.kill()
            worker.process.join(STOP_SECONDS)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
        run.seconds = time.monotonic() - began
    return run


__all__ = ["run_pool", "worker_devices"]
