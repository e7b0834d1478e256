"""A corpus replay: many traces through one implementation, each trace's outcome and the run's.

``replay_one`` replays one trace and never raises for what the trace or the implementation
does: its ``TraceResult`` says passed, mismatch, raised or refused. The local pool
(``traces.corpus.pool``) and the Ray runner (``traces.corpus.ray_tasks``) call it in their
workers and add ``crashed`` when a worker dies under a trace. This module imports no torch at
the top, so a worker can pin its device before torch starts.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from traces.format.schema import SUFFIX
from traces.replay.tolerances import Tolerance

OUTCOME_CODES = {"passed": 0, "mismatch": 1, "refused": 2, "raised": 3, "crashed": 3}
"""Outcome of one trace -> the exit code ``kda replay`` gives it alone: 0 match, 1 mismatch,
2 bad input (a damaged trace), 3 runtime failure (the implementation raised, or its worker died)."""

FAILED = ("mismatch", "raised", "crashed")
"""Outcomes counted as failures (JUnit: ``mismatch`` a failure, the others errors)."""

MAX_FAILING = 10
"""Failing tensor comparisons a trace's result keeps (the first ones); a replay of the trace
alone (``kda replay TRACE --format json``) lists every event and tensor."""


class CorpusError(ValueError):
    """A corpus that cannot be run: a path that does not exist, a folder with no trace."""


def find_traces(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """The traces named by ``paths``: a file as given, a folder's ``*.safetensors`` files
    (searched recursively, sorted by path); a file named twice runs once. Raises
    ``CorpusError`` for a missing path or a folder holding no trace."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            inside = sorted(f for f in p.rglob(f"*{SUFFIX}") if f.is_file())
            if not inside:
                raise CorpusError(f"{p}: the folder holds no *{SUFFIX} file")
            found += inside
        elif p.is_file():
            found.append(p)
        else:
            raise CorpusError(f"{p}: no such file or folder")
    seen: set[Path] = set()
    return [f for f in found if not (f.resolve() in seen or seen.add(f.resolve()))]


@dataclass(frozen=True)
class ReplaySettings:
    """What every trace of a corpus is replayed with (plain values: it travels to workers)."""

    impl: str = "triton"
    tolerances: dict[str, Tolerance] = field(default_factory=dict)
    stop_at_first: bool = False


@dataclass
class TraceResult:
    """One trace's outcome (a key of ``OUTCOME_CODES``). ``message`` is one line: the first
    mismatch, what the implementation raised, why the trace was refused or how the worker
    died. ``report`` (``brief_report``) is set when the replay ran to its end; ``seconds`` is
    wall time, reading the trace included; ``worker`` names where it ran."""

    trace: str
    outcome: str
    seconds: float
    message: str = ""
    worker: str = ""
    report: dict[str, Any] | None = None

    @property
    def code(self) -> int:
        return OUTCOME_CODES[self.outcome]

    def to_json(self) -> dict[str, Any]:
        return {"trace": self.trace, "outcome": self.outcome, "exit_code": self.code, "seconds": self.seconds,
                "message": self.message, "worker": self.worker, "report": self.report}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "TraceResult":
        return cls(data["trace"], data["outcome"], data["seconds"], data["message"], data["worker"], data["report"])


@dataclass
class CorpusRun:
    """A corpus replay: ``traces`` in the order asked, ``results`` in the order they finished
    (fewer when ``interrupted``), ``seconds`` of wall time, ``workers`` run at once."""

    traces: list[str]
    workers: int
    where: str
    results: list[TraceResult] = field(default_factory=list)
    seconds: float = 0.0
    interrupted: bool = False

    def counts(self) -> dict[str, int]:
        """Traces per outcome, and ``not_run`` (those an interruption left)."""
        out = {outcome: 0 for outcome in OUTCOME_CODES}
        for r in self.results:
            out[r.outcome] += 1
        out["not_run"] = len(self.traces) - len(self.results)
        return out

    @property
    def exit_code(self) -> int:
        """The worst trace's exit code (``OUTCOME_CODES``); 0 for an empty run."""
        return max((r.code for r in self.results), default=0)

    def slowest(self) -> TraceResult | None:
        return max(self.results, key=lambda r: r.seconds, default=None)

    def to_json(self) -> dict[str, Any]:
        """The whole run as ``kda replay --format json`` prints it: traces in the order asked."""
        by_trace = {r.trace: r for r in self.results}
        slowest = self.slowest()
        return {"where": self.where, "workers": self.workers, "interrupted": self.interrupted,
                "exit_code": self.exit_code, "seconds": self.seconds,
                "summary": {**self.counts(), "traces": len(self.traces),
                            "slowest": None if slowest is None else {"trace": slowest.trace,
                                                                     "seconds": slowest.seconds}},
                "traces": [by_trace[t].to_json() if t in by_trace else {"trace": t, "outcome": "not_run"}
                           for t in self.traces]}


_impls: dict[str, Any] = {}
"""Implementations a worker process has loaded, by spec: each is imported once per process."""


def replay_one(path: str | os.PathLike, settings: ReplaySettings, device: str, *, worker: str = "",
               name: str | None = None) -> TraceResult:
    """Replay the trace at ``path`` through ``settings.impl`` on ``device`` (the kernels'
    interpreter choice made already). ``name`` is how the result names the trace (default:
    ``path``). Never raises for what the trace or implementation does; Ctrl-C passes through."""
    from traces.impl.loader import ImplError, load_impl
    from traces.format.io import read_trace
    from traces.replay.engine import ReplayFailure, replay
    from traces.format.schema import TraceError

    name = str(path) if name is None else name
    began = time.monotonic()

    def result(outcome: str, message: str = "", report: dict | None = None) -> TraceResult:
        return TraceResult(name, outcome, time.monotonic() - began, message, worker, report)

    try:
        if settings.impl not in _impls:
            _impls[settings.impl] = load_impl(settings.impl)
        with read_trace(path) as trace:
            report = replay(trace, _impls[settings.impl], device=device, impl_name=settings.impl,
                            tolerances=settings.tolerances, stop_at_first=settings.stop_at_first)
    except (TraceError, ImplError, OSError) as exc:
        return result("refused", str(exc))
    except ReplayFailure as exc:
        return result("raised", f"{settings.impl} failed at {exc}")
    failing = [c for c in report.comparisons if not c.passed]
    if not failing:
        return result("passed", report=brief_report(report))
    return result("mismatch", first_mismatch(failing[0]), brief_report(report))


def brief_report(report) -> dict[str, Any]:
    """A ``traces.replay.engine.ReplayReport`` as a corpus keeps it: ``to_json()`` without the
    per-event and final comparisons, with ``compared`` (tensors compared), ``failing`` (how
    many failed) and ``first_failing`` (the first ``MAX_FAILING`` failing comparisons)."""
    failing = [c for c in report.comparisons if not c.passed]
    kept = {k: v for k, v in report.to_json().items() if k not in ("events", "final")}
    return {**kept, "compared": len(report.comparisons), "failing": len(failing),
            "first_failing": [c.to_json() for c in failing[:MAX_FAILING]]}


def first_mismatch(c) -> str:
    """One line for a failing ``traces.replay.compare.Comparison``: where its first bad element is,
    its values, and how many elements fail."""
    bad = c.first_bad
    where = " ".join(f"{k}={v}" for k, v in bad.coords.items()) if bad is not None else ""
    values = f": actual {bad.actual:.6g}, expected {bad.expected:.6g}" if bad is not None else ""
    return (f"{c.tensor}: {c.mismatches} of {c.compared} elements beyond atol={c.tolerance.atol:g} "
            f"rtol={c.tolerance.rtol:g}; first at {where}{values}")


def device_label(device: str) -> str:
    """How a run names where it ran: ``cuda``, or ``cpu (Triton interpreter)``."""
    return "cpu (Triton interpreter)" if device == "cpu" else device


def prepare_process(device: str) -> None:
    """Set a worker process up for ``device`` (``cuda`` or ``cpu``) before it imports the
    kernels: the Triton interpreter on the CPU, one torch thread per CPU worker."""
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        import warnings

        import torch

        torch.set_num_threads(1)
        warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")
        from kernels.interpreter import skip_repatching_in_helper_calls

        skip_repatching_in_helper_calls()


__all__ = ["CorpusError", "CorpusRun", "FAILED", "MAX_FAILING", "OUTCOME_CODES", "ReplaySettings", "TraceResult",
           "brief_report", "device_label", "find_traces", "first_mismatch", "prepare_process", "replay_one"]
