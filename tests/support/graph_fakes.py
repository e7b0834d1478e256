"""A graph class for testing ``traces.record.graphs`` on a CPU.

``FakeGraph`` has a CUDA graph's ``capture_begin``, ``capture_end`` and ``replay``: its
capture of ``fn`` (``capture(fn)``) runs ``fn`` between the first two, and ``replay()`` runs
``fn`` again. Where a CUDA graph re-runs the device work its capture recorded, the fake
re-runs the Python that issued it, so code that records inside a capture runs again at a
replay: ``GraphTape`` then copies into the buffers of the same call, as the captured copies
of a CUDA graph do. ``is_capturing()`` is True while a fake graph captures or replays (the
code it runs takes the path it took at capture); ``torch_capturing()`` makes
``torch.cuda.is_available`` and ``torch.cuda.is_current_stream_capturing`` say so too.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch

from traces.record.graphs import GraphHooks

_active: list["FakeGraph"] = []


class FakeGraph:
    """A graph of one Python callable, on the CPU (module docstring)."""

    def __init__(self):
        self.fn: Callable[[], object] | None = None

    def capture(self, fn: Callable[[], object]) -> None:
        """Capture ``fn``: ``capture_begin``, ``fn()``, ``capture_end`` (also when ``fn`` raises,
        as ``torch.cuda.graph`` ends its capture)."""
        self.fn = fn
        self.capture_begin()
        try:
            fn()
        finally:
            self.capture_end()

    def capture_begin(self, *args, **kwargs) -> None:
        _active.append(self)

    def capture_end(self) -> None:
        _active.remove(self)

    def replay(self) -> None:
        if self.fn is None:
            raise RuntimeError("replay of a FakeGraph never captured")
        _active.append(self)
        try:
            self.fn()
        finally:
            _active.remove(self)


def is_capturing() -> bool:
    """Whether a fake graph is capturing or replaying now."""
    return bool(_active)


def fake_hooks(on_replay=None) -> GraphHooks:
    """``GraphHooks`` on ``FakeGraph``, whose captures are on the CPU (not installed)."""
    return GraphHooks(on_replay, FakeGraph, device=lambda: torch.device("cpu"))


@contextmanager
def torch_capturing() -> Iterator[None]:
    """Within it, torch says a CUDA stream is capturing (and CUDA is available) while a fake
    graph captures or replays."""
    available, capturing = torch.cuda.is_available, torch.cuda.is_current_stream_capturing
    torch.cuda.is_available = lambda: is_capturing() or available()
    torch.cuda.is_current_stream_capturing = lambda: is_capturing() or capturing()
    try:
        yield
    finally:
        torch.cuda.is_available, torch.cuda.is_current_stream_capturing = available, capturing
