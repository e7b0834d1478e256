"""A corpus replay on a Ray cluster: one task per trace, with one GPU each.

On a cluster with GPUs each task asks for ``num_gpus=1`` (Ray pins it through
``CUDA_VISIBLE_DEVICES``); on a cluster without, ``num_cpus=1`` and the Triton interpreter.
A task reads its trace where it is (a path every node sees) or, with ``ship``, gets the
file's bytes through Ray's object store. Every node needs this package and the
implementation importable (a ``.py`` implementation at the same path). A task whose
worker process dies is that trace's ``crashed``; tasks are never retried. Ctrl-C cancels
every task and returns the run so far, marked interrupted. Ray's own notices (a worker that
died) go to stderr while the run lasts: stdout carries the report.
"""

from __future__ import annotations

import signal
import sys
import tempfile
import time
from collections import deque
from contextlib import redirect_stdout
from pathlib import Path
from typing import Callable

from traces.corpus.run import (
    CorpusError, CorpusRun, ReplaySettings, TraceResult, device_label, prepare_process, replay_one,
)

INSTALL = "pip install 'kda-recoverssm[ray]'"
IN_FLIGHT = 2
"""Tasks submitted and not finished, per task the cluster runs at once."""
LOCAL = "local"
"""The ``address`` that starts a Ray instance of this process's own (``workers`` CPUs)."""


def _task(path: str, data: bytes | None, settings: ReplaySettings) -> dict:
    """One trace, in a Ray worker: its result as ``TraceResult.to_json``."""
    import socket

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    prepare_process(device)
    where = f"{socket.gethostname()}:{device}"
    if data is None:
        return replay_one(path, settings, device, worker=where).to_json()
    with tempfile.TemporaryDirectory(prefix="kda-corpus-") as folder:
        copy = Path(folder) / Path(path).name
        copy.write_bytes(data)
        return replay_one(copy, settings, device, worker=where, name=path).to_json()


def run_ray(traces: list[Path], settings: ReplaySettings, *, address: str, ship: bool = False,
            workers: int | None = None, on_result: Callable[[TraceResult], None] | None = None) -> CorpusRun:
    """Replay ``traces`` as Ray tasks on the cluster at ``address`` (``auto``, ``ray://...``,
    or ``local`` for an instance of ``workers`` CPUs started here and stopped after).
    ``ship`` sends each file's bytes with its task instead of its path. ``on_result`` gets
    each result as it comes. Raises ``CorpusError`` when Ray is not installed or the cluster
    cannot be reached."""
    try:
        import ray
    except ImportError:
        raise CorpusError(f"--ray needs Ray, which is not installed: {INSTALL}") from None
    with redirect_stdout(sys.stderr):
        return _run(ray, traces, settings, address, ship, workers, on_result)


def _run(ray, traces: list[Path], settings: ReplaySettings, address: str, ship: bool, workers: int | None,
         on_result: Callable[[TraceResult], None] | None) -> CorpusRun:
    began = time.monotonic()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if address == LOCAL:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise CorpusError(f"--ray {address}: cannot reach the cluster: {exc}") from None
    finally:
        for sig, handler in handlers.items():  # ray.init sets its own SIGTERM handler, which exits at once
            signal.signal(sig, handler)
    try:
        gpus = ray.cluster_resources().get("GPU", 0)
        task = ray.remote(_task).options(num_gpus=1 if gpus else 0, num_cpus=0 if gpus else 1, max_retries=0)
        run = CorpusRun([str(t) for t in traces], int(gpus or ray.cluster_resources().get("CPU", 1)),
                        f"ray {address}, {device_label('cuda' if gpus else 'cpu')}")
        waiting = deque(traces)
        pending: dict = {}  # task -> (trace, when it was submitted)

        def submit() -> None:  # a bounded number in flight: shipped bytes are read as tasks go
            while waiting and len(pending) < IN_FLIGHT * run.workers:
                path = waiting.popleft()
                pending[task.remote(str(path), path.read_bytes() if ship else None, settings)] = \
                    (str(path), time.monotonic())

        try:
            submit()
            while pending:
                [ref], _ = ray.wait(list(pending), num_returns=1)
                trace, sent = pending.pop(ref)
                submit()
                try:
                    result = TraceResult.from_json(ray.get(ref))
                except ray.exceptions.RayError as exc:
                    why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                    result = TraceResult(trace, "crashed", time.monotonic() - sent,
                                         f"the Ray task failed: {type(exc).__name__}: {why}")
                run.results.append(result)
                if on_result is not None:
                    on_result(result)
        except KeyboardInterrupt:
            run.interrupted = True
            for ref in pending:
                ray.cancel(ref, force=True)
    finally:
        ray.shutdown()
    run.seconds = time.monotonic() - began
    return run


__all__ = ["INSTALL", "LOCAL", "run_ray"]
