"""Process-level set-up shared by every command: device choice, errors and exit codes.

Exit codes: 0 match, 1 numerical mismatch, 2 bad input or usage, 3 runtime failure.
"""

from __future__ import annotations

import os
import sys
import unicodedata
from contextlib import contextmanager
from typing import Iterator

EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_BAD_INPUT = 2
EXIT_RUNTIME = 3

FORMATS = ("human", "json")
"""What ``--format`` accepts, for every command that prints a report."""


class CommandError(Exception):
    """A known failure: printed as one ``Error:`` line, then the process exits with ``code``."""

    def __init__(self, message: str, code: int = EXIT_BAD_INPUT):
        super().__init__(message)
        self.code = code


def printable(text: str) -> str:
    """``text`` with every control, format or line-separator character escaped as Python
    writes it (``\\n``, ``\\x1b``, ``\\u202e``, ``\\u2028``), so that names and free
    text from a file print as one inert line."""
    return "".join(ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch)[0] == "C"
                   or unicodedata.category(ch) in ("Zl", "Zp") else ch for ch in text)


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def select_device() -> str:
    """``cuda`` when present; otherwise switch Triton to its interpreter and use the CPU.

    Must run before ``kernels`` is imported: the interpreter is chosen when kernels are defined.
    """
    if cuda_available():
        return "cuda"
    if "kernels.verify" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise CommandError("no CUDA device, and the kernels were imported before the Triton interpreter "
                           "was enabled; set TRITON_INTERPRET=1", EXIT_RUNTIME)
    os.environ["TRITON_INTERPRET"] = "1"
    return "cpu"


def check_format(format: str) -> None:
    """``--format`` is human or json; anything else is a usage error."""
    if format not in FORMATS:
        raise CommandError(f"--format {format}: expected human or json", EXIT_BAD_INPUT)


@contextmanager
def bad_input(prefix: str = "") -> Iterator[None]:
    """A trace that breaks the format (``TraceError``) or an implementation that cannot be
    loaded (``ImplError``) inside the block is bad input: one ``Error:`` line, exit 2."""
    from traces.impl import ImplError
    from traces.schema import TraceError

    try:
        yield
    except (TraceError, ImplError) as exc:
        raise CommandError(f"{prefix}{exc}", EXIT_BAD_INPUT) from None


def make_console(stderr: bool = False, pipe_width: int | None = None):
    """A rich console on stdout (or stderr) that honours ``NO_COLOR`` and never highlights;
    when it writes to a file or a pipe, ``pipe_width`` columns unless ``COLUMNS`` is set."""
    from rich.console import Console

    out = Console(file=sys.stderr if stderr else sys.stdout, no_color=bool(os.environ.get("NO_COLOR")),
                  highlight=False, soft_wrap=True)
    if pipe_width is not None and not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = pipe_width
    return out
