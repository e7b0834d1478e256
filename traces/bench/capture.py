"""CUDA graph capture: never cut half way by Ctrl-C or SIGTERM (``interrupts_held``, from
``traces.format.signals``), and an implementation that synchronises with the host is refused before
it is captured.

Each row's graph is captured after two warm-up runs on a side stream (the second under
``torch.cuda.set_sync_debug_mode("error")``), so such an implementation's row fails loudly
instead of being timed wrongly. The capture runs on that same stream, as an engine captures
on the stream it warmed up on, so what the kernels keep per stream (the flushing token loop's
row counters, docs/implementations.md) is the warm-up's, outside the graph's memory pool.
"""

from __future__ import annotations

from typing import Callable

import torch

from traces.format.signals import interrupts_held


class SyncError(RuntimeError):
    """The implementation synchronised with the host, so it cannot run inside a CUDA graph."""


def warm_and_capture(run: Callable[[], None], restore: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """Warm up on a side stream (compiles kernels), check that no call synchronises with the
    host, then capture ``run`` in a CUDA graph on that stream. Nothing is timed here."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        restore()
        run()
        restore()
        failure = None
        torch.cuda.set_sync_debug_mode("error")
        try:
            run()
        except RuntimeError as exc:
            failure = exc
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    if failure is not None:
        raise SyncError(f"synchronises with the host, so it cannot run in a CUDA graph (use --eager): {failure}")
    graph = torch.cuda.CUDAGraph()
    with interrupts_held(), torch.cuda.graph(graph, stream=side):
        run()
    torch.cuda.synchronize()
    return graph
