"""Process-level set-up shared by every command: exit codes, errors, signals, device choice.

Exit codes: 0 match, 1 numerical mismatch, 2 bad input or usage, 3 runtime failure,
130 and 143 stopped by SIGINT (Ctrl-C) and SIGTERM.
"""

from __future__ import annotations

import os
import signal
import sys
import warnings
from contextlib import contextmanager
from typing import Iterator

EXIT_MISMATCH = 1
EXIT_BAD_INPUT = 2
EXIT_RUNTIME = 3

_signals: list[int] = []
"""The stopping signal received first (SIGINT or SIGTERM), once one has come."""


class CommandError(Exception):
    """A known failure: printed as one ``Error:`` line, then the process exits with ``code``."""

    def __init__(self, message: str, code: int = EXIT_BAD_INPUT):
        super().__init__(message)
        self.code = code


def _stop(signum: int, frame) -> None:
    """The first SIGINT or SIGTERM stops the command as ``KeyboardInterrupt``; later ones
    are ignored, so the clean-up it starts (temporary files, partial summaries) finishes."""
    if not _signals:
        _signals.append(signum)
        raise KeyboardInterrupt


@contextmanager
def stop_signals() -> Iterator[None]:
    """Within: SIGINT and SIGTERM stop the command as ``KeyboardInterrupt`` (``interrupted``
    then gives its exit status); the handlers before are back after. Main thread only."""
    _signals.clear()
    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def interrupted(detail: str = "") -> CommandError:
    """The ``Error:`` line and exit status (128 + signal number) of a command stopped by a signal."""
    signum = _signals[0] if _signals else signal.SIGINT
    name = signal.Signals(signum).name
    return CommandError(f"interrupted by {name}" + (f"; {detail}" if detail else ""), 128 + int(signum))


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def select_device() -> str:
    """``cuda`` when present; otherwise switch Triton to its interpreter and use the CPU.

    Must run before ``kernels`` is imported: the interpreter is chosen when kernels are defined.
    Under the interpreter, numpy's ``RuntimeWarning`` when ``exp`` overflows to inf (as a
    sigmoid's may) is hidden: the result is IEEE-correct and any non-finite output fails the
    comparison anyway.
    """
    if cuda_available():
        device = "cuda"
    else:
        if "kernels.verify" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise CommandError("no CUDA device, and the kernels were imported before the Triton interpreter "
                               "was enabled; set TRITON_INTERPRET=1", EXIT_RUNTIME)
        os.environ["TRITON_INTERPRET"] = "1"
        warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")
        from kernels.interpreter import skip_repatching_in_helper_calls

        skip_repatching_in_helper_calls()
        device = "cpu"
    _check_forced_designs()
    return device


def _check_forced_designs() -> None:
    """A bad ``KDA_DESIGN`` is bad input, refused before any work (``kernels.launch``)."""
    if not os.environ.get("KDA_DESIGN", "").strip():
        return
    from kernels.launch import forced_designs

    try:
        forced_designs()
    except ValueError as exc:
        raise CommandError(str(exc), EXIT_BAD_INPUT) from None


@contextmanager
def bad_input(prefix: str = "") -> Iterator[None]:
    """A trace that breaks the format (``TraceError``) or an implementation that cannot be
    loaded (``ImplError``) inside the block is bad input: one ``Error:`` line, exit 2."""
    from traces.impl.loader import ImplError
    from traces.format.schema import TraceError

    try:
        yield
    except (TraceError, ImplError) as exc:
        raise CommandError(f"{prefix}{exc}", EXIT_BAD_INPUT) from None
