"""Replaying one trace several times and comparing the runs bit for bit.

A logic bug fails the same way every time; a race moves. Each run plays the trace's
events through the implementation from the same initial buffers under a
``traces.record.recorder.Recorder`` (a trace of format v2: ``traces.repro.expected.played``),
and every result it records is compared bitwise with the first run's. A run that raises is compared up to where it raised, and the error message
is compared too.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from traces.format.io import read_trace
from traces.record.recorder import record_play
from traces.format.tape import Tape
from traces.replay.buffers import initial_buffers
from traces.repro.expected import played


@dataclass
class Difference:
    """Run ``run`` differs from run 0 at this event's ``tensor`` in ``elements`` elements
    (-1: the tensor exists in one run only, or its shape differs)."""

    run: int
    event: int
    op: str
    tensor: str
    elements: int

    def to_json(self) -> dict[str, Any]:
        return {"run": self.run, "event": self.event, "op": self.op, "tensor": self.tensor, "elements": self.elements}


@dataclass
class DeterminismReport:
    runs: int
    differences: list[Difference] = field(default_factory=list)
    errors: list[str | None] = field(default_factory=list)
    """Per run: what the implementation raised, or None."""

    @property
    def deterministic(self) -> bool:
        return not self.differences and len(set(self.errors)) <= 1

    def to_json(self) -> dict[str, Any]:
        return {"runs": self.runs, "deterministic": self.deterministic,
                "differences": [d.to_json() for d in self.differences], "errors": self.errors}


def check_determinism(tape: Tape, impl, runs: int, device: str = "cpu") -> DeterminismReport:
    """Play ``tape`` ``runs`` times (>= 2) through ``impl`` and compare every result bitwise."""
    report = DeterminismReport(runs)
    results: list[list[dict[str, torch.Tensor]]] = []
    with tempfile.TemporaryDirectory(prefix="kda-determinism-") as tmp:
        for r in range(runs):
            path = Path(tmp) / f"run-{r}.safetensors"
            error, run = None, []
            try:
                if tape.version == 1:
                    record_play(tape, impl, path, device, bufs=initial_buffers(tape, impl, device))
                else:
                    for expected in played(tape, impl, device):
                        run.append(expected)
            except Exception as exc:  # the implementation raised: compare what completed
                error = f"{type(exc).__name__}: {exc}"
            report.errors.append(error)
            if path.exists():
                with read_trace(path) as trace:
                    run = [s.expected for s in Tape.load(trace).steps]
            results.append(run)
    for r in range(1, runs):
        for i, (ops, first, other) in enumerate(zip(tape.steps, results[0], results[r])):
            for name in sorted(set(first) | set(other)):
                n = _differing(first.get(name), other.get(name))
                if n:
                    report.differences.append(Difference(r, i, ops.op, name, n))
    return report


def _differing(a: torch.Tensor | None, b: torch.Tensor | None) -> int:
    """Elements whose bits differ; -1 when one is missing or the shapes or dtypes differ."""
    if a is None or b is None or a.shape != b.shape or a.dtype != b.dtype:
        return -1
    if a.numel() == 0:
        return 0
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return int((a.contiguous().view(width) != b.contiguous().view(width)).sum())


__all__ = ["DeterminismReport", "Difference", "check_determinism"]
