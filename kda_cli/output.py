"""Output for every command: data on stdout (human text or plain ``json.dumps``), progress
and errors on stderr.

Progress is a bar on a terminal; elsewhere (a log, a pipe) it is one plain line at most
every ``LINE_SECONDS`` seconds and one at the end, so a long run is never silent, a log never
floods and its last line says how far the work went.
"""

from __future__ import annotations

import json
import os
import sys
import time
import unicodedata
from contextlib import AbstractContextManager, contextmanager, nullcontext, redirect_stdout
from typing import Any, Callable, Iterator, Sequence

LINE_SECONDS = 5.0
"""Least time between two progress lines outside a terminal."""

PIPE_WIDTH = 160
"""Columns of a replay's human report written to a file or a pipe: tables are not truncated."""


def make_console(stderr: bool = False, pipe_width: int | None = None):
    """A rich console on stdout (or stderr) that honours ``NO_COLOR``, never highlights and
    never turns ``:name:`` into an emoji (``--events a:b:`` and file names print as given);
    when it writes to a file or a pipe, ``pipe_width`` columns unless ``COLUMNS`` is set."""
    from rich.console import Console

    out = Console(file=sys.stderr if stderr else sys.stdout, no_color=bool(os.environ.get("NO_COLOR")),
                  highlight=False, emoji=False, soft_wrap=True)
    if pipe_width is not None and not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = pipe_width
    return out


class _ClosedPipeSafe:
    """A text stream that drops what is written once its reader has gone away (a closed pipe)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self._closed()
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._closed()

    def _closed(self) -> None:
        """What is written from now on, and what is still buffered, goes to the null device."""
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self.stream.fileno())
        finally:
            os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


@contextmanager
def closed_pipes_ignored() -> Iterator[None]:
    """Within: a stdout or stderr whose reader went away (``kda replay | head -2``) drops what
    is written to it instead of raising, so the command ends with its own exit code (a closed
    pipe is not a mismatch); both are flushed on the way out, then put back."""
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _ClosedPipeSafe(sys.stdout), _ClosedPipeSafe(sys.stderr)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = streams


def implementation_prints(format: str) -> AbstractContextManager:
    """Where an implementation's own ``print`` goes while it loads and runs: stderr when
    stdout carries the JSON report, so that stdout stays one JSON document."""
    return redirect_stdout(sys.stderr) if format == "json" else nullcontext()


def printable(text: str) -> str:
    """``text`` with every control, format or line-separator character escaped as Python
    writes it (``\\n``, ``\\x1b``, ``\\u202e``, ``\\u2028``), so that names and free
    text from a file print as one inert line."""
    return "".join(ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch)[0] == "C"
                   or unicodedata.category(ch) in ("Zl", "Zp") else ch for ch in text)


def emit(data: dict[str, Any], format: str, human: Callable[[dict[str, Any]], None]) -> None:
    """Print ``data`` as one JSON line (``format == "json"``) or through ``human``."""
    if format == "json":
        print(json.dumps(data), flush=True)
    else:
        human(data)


def plural(n: int, word: str, words: str | None = None) -> str:
    """``1 event``, ``2 events``."""
    return f"{n} {word if n == 1 else (words or word + 's')}"


def human_value(value: Any) -> str:
    """A JSON value as a reader wants it, never a Python repr: lists comma-separated, a dict
    as ``key value`` pairs, ``None`` and empty values as ``none``, booleans as yes/no."""
    if value is None or value == "" or value == [] or value == {}:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(human_value(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k} {human_value(v)}" for k, v in value.items())
    return str(value)


def routes_text(routes: dict[str, str]) -> str:
    """Which op ran through which implementation, each implementation named once:
    ``tests/x.py: verify (kda_recoverssm_verify), defer (...); triton: plan, commit``."""
    from traces.impl.surface import routes_by_implementation

    return "; ".join(f"{name}: {', '.join(ops)}" for name, ops in routes_by_implementation(routes).items())


def duration(seconds: float) -> str:
    """``40 s``, ``14 min``, ``2 h 5 min``: a time to wait, as precise as it is worth."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 90 else f"{minutes // 60} h {minutes % 60} min"


def note(message: str) -> None:
    """One line of progress or context on stderr."""
    print(message, file=sys.stderr, flush=True)


class Progress:
    """Progress of ``total`` steps on stderr: a transient bar on a terminal, else a line
    ``"{label}: done/total"`` on the first update, then at most every ``LINE_SECONDS``, and
    a last one with the final count when the block ends (unless that was the line before, or
    no line came); nothing when ``enabled`` is false. With ``weights`` (each step's relative cost), both
    show the time left (``about 3 min left``): the time so far, scaled by the weight left
    over the weight done.

    Use as a context manager; ``update(done, total)`` matches the engines' progress callbacks.
    """

    def __init__(self, label: str, total: int, enabled: bool = True, terminal: bool | None = None,
                 weights: Sequence[float] | None = None):
        self.label, self.total, self.enabled = label, total, enabled
        self.terminal = sys.stderr.isatty() if terminal is None else terminal
        self.weights = list(weights) if weights is not None else None
        self.bar = self.task = None
        self.last_line: float | None = None
        self.shown: int | None = None
        """The count the last line showed."""
        self.started = time.monotonic()
        self.done = 0

    def __enter__(self) -> "Progress":
        self.started = time.monotonic()
        if self.enabled and self.terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn

            self.bar = Bar(self.label, BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           TextColumn("{task.fields[left]}"), console=make_console(stderr=True), transient=True)
            self.bar.__enter__()
            self.task = self.bar.add_task(self.label, total=self.total, left="")
        return self

    def left(self, now: float) -> str:
        """``about 3 min left`` at time ``now`` (``time.monotonic``), from the weights of the
        steps done and to do; ``""`` without weights or before a step with weight is done."""
        if self.weights is None:
            return ""
        done, to_do = sum(self.weights[:self.done]), sum(self.weights[self.done:self.total])
        if done <= 0:
            return ""
        return f"about {duration((now - self.started) * to_do / done)} left" if to_do > 0 else ""

    def update(self, done: int, total: int | None = None) -> None:
        self.done = done
        if total is not None:
            self.total = total
        if not self.enabled:
            return
        now = time.monotonic()
        if self.bar is not None:
            self.bar.update(self.task, completed=done, total=self.total, left=self.left(now))
            return
        if self.last_line is None or now - self.last_line >= LINE_SECONDS:
            self.last_line, self.shown = now, done
            left = self.left(now)
            note(f"{self.label}: {done}/{self.total}" + (f", {left}" if left else ""))

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)
        elif self.enabled and exc[0] is None and self.shown is not None and self.shown != self.done:
            self.shown = self.done
            note(f"{self.label}: {self.done}/{self.total}")
