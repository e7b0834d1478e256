"""Parsers and checks shared by the commands: formats, tolerances, event ranges, lists, and
output paths. None of them imports torch, so a bad argument is refused before any heavy
import."""

from __future__ import annotations

import math

import os
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional

from kda_cli.runtime import EXIT_BAD_INPUT, CommandError

FORMATS = ("human", "json")
"""What ``--format`` accepts, for every command that prints a report."""


def check_format(format: str) -> None:
    """``--format`` is human or json; anything else is a usage error."""
    if format not in FORMATS:
        raise CommandError(f"--format {format}: expected human or json", EXIT_BAD_INPUT)


def parse_tolerances(atol: Iterable[str], rtol: Iterable[str]) -> dict:
    """``--atol``/``--rtol`` values ``DTYPE=X`` or ``X`` (every float dtype) -> per-dtype
    ``Tolerance``, the defaults where not overridden. ``DTYPE`` is a full or a short name
    (``bfloat16`` or ``bf16``: ``traces.format.dtype_names``)."""
    from traces.format.dtype_names import dtype_name, spelled
    from traces.replay.tolerances import DEFAULT_TOLERANCES, Tolerance

    table = dict(DEFAULT_TOLERANCES)
    for option, values in (("atol", atol), ("rtol", rtol)):
        for value in values:
            given, _, number = value.rpartition("=")
            dtype = dtype_name(given)
            dtypes = [dtype] if given else list(table)
            if given and dtype not in table:
                raise CommandError(f"--{option} {value}: unknown dtype {given!r} (one of {spelled(table)})",
                                   EXIT_BAD_INPUT)
            try:
                x = float(number)
            except ValueError:
                raise CommandError(f"--{option} {value}: expected DTYPE=NUMBER or NUMBER", EXIT_BAD_INPUT) from None
            if not 0 <= x < math.inf:
                raise CommandError(f"--{option} {value}: must be a finite number >= 0", EXIT_BAD_INPUT)
            for d in dtypes:
                old = table[d]
                table[d] = Tolerance(x, old.rtol) if option == "atol" else Tolerance(old.atol, x)
    return table


def parse_range(text: Optional[str]) -> tuple[Optional[int], Optional[int]]:
    """``A:B`` (either side may be empty) or ``A`` (event A alone) -> ``(A, B)`` with ``None``
    for an empty side; refuses what no trace could satisfy (negative, or A >= B)."""
    if text is None:
        return None, None
    start, sep, stop = text.partition(":")
    try:
        a = int(start) if start.strip() else None
        b = int(stop) if stop.strip() else None
    except ValueError:
        raise CommandError(f"--events {text}: expected A:B with integers", EXIT_BAD_INPUT) from None
    if not sep:
        if a is None:
            raise CommandError(f"--events {text}: expected A:B with integers", EXIT_BAD_INPUT)
        b = a + 1
    if (a is not None and a < 0) or (b is not None and b < 0):
        raise CommandError(f"--events {text}: event numbers start at 0", EXIT_BAD_INPUT)
    if a is not None and b is not None and a >= b:
        raise CommandError(f"--events {text}: the range is empty (A must be less than B)", EXIT_BAD_INPUT)
    return a, b


def resolve_range(text: Optional[str], count: int) -> tuple[int, int]:
    """``--events`` against a trace of ``count`` events -> a half-open range within it. A
    trace with no events is bad input: there is nothing to run."""
    a, b = parse_range(text)
    if count == 0:
        raise CommandError("the trace has no events" + (f" (--events {text})" if text is not None else ""),
                           EXIT_BAD_INPUT)
    a = 0 if a is None else a
    b = count if b is None else b
    if b > count:
        last = f"0..{count - 1}" if count else "none"
        raise CommandError(f"--events {text}: past the end (the trace has events {last})", EXIT_BAD_INPUT)
    if a >= b:
        raise CommandError(f"--events {text}: the range is empty (the trace has {count} events)", EXIT_BAD_INPUT)
    return a, b


def parse_ints(option: str, text: Optional[str], minimum: int = 1) -> tuple[int, ...]:
    """Comma-separated integers of at least ``minimum``; ``()`` when the option was not given."""
    if text is None:
        return ()
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise CommandError(f"{option} {text}: expected comma-separated integers", EXIT_BAD_INPUT) from None
    if not values or min(values) < minimum:
        raise CommandError(f"{option} {text}: expected {'positive integers' if minimum == 1 else f'integers >= {minimum}'}",
                           EXIT_BAD_INPUT)
    return values


def parse_names(values: Iterable[str]) -> tuple[str, ...]:
    """Repeated and comma-separated names, in order, blanks dropped."""
    return tuple(part.strip() for value in values for part in value.split(",") if part.strip())


def parse_designs(option: str, text: Optional[str], designs: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """``OP=DESIGN[,OP=DESIGN...]`` -> op -> design, each op and design one of ``designs``
    (``kernels.launch.DESIGNS``), each op named once; ``{}`` when the option was not given."""
    if text is None:
        return {}
    forced: dict[str, str] = {}
    for entry in (part.strip() for part in text.split(",")):
        op, sep, design = (side.strip() for side in entry.partition("="))
        if not sep or not op or not design:
            raise CommandError(f"{option} {text}: expected OP=DESIGN[,OP=DESIGN...], got {entry!r}", EXIT_BAD_INPUT)
        if op not in designs:
            raise CommandError(f"{option} {text}: unknown op {op!r} (ops: {', '.join(designs)})", EXIT_BAD_INPUT)
        if design not in designs[op]:
            raise CommandError(f"{option} {text}: unknown {op} design {design!r} (designs: "
                               f"{', '.join(designs[op])})", EXIT_BAD_INPUT)
        if op in forced:
            raise CommandError(f"{option} {text}: {op} given twice", EXIT_BAD_INPUT)
        forced[op] = design
    return forced


def choice(option: str, value: str, allowed: Iterable[str]) -> str:
    """``value`` if it is one of ``allowed``, else a usage error listing them."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise CommandError(f"{option} {value}: expected one of {', '.join(allowed)}", EXIT_BAD_INPUT)
    return value


def _writable_folder(folder: Path, option: str, path: Path) -> None:
    if not folder.exists():
        raise CommandError(f"{option} {path}: folder {folder} does not exist (create it first)", EXIT_BAD_INPUT)
    if not folder.is_dir():
        raise CommandError(f"{option} {path}: {folder} is not a folder", EXIT_BAD_INPUT)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CommandError(f"{option} {path}: cannot write in {folder} (permission denied)", EXIT_BAD_INPUT)


def force_option(what: str):
    """The ``--force`` flag of a command that writes ``what``: without it an existing output is refused."""
    import typer

    return typer.Option(False, "--force", help=f"Overwrite {what} when it exists (refused otherwise).")


def output_file(path: Path, option: str, *, inputs: Iterable[Path] = (), force: bool = False) -> None:
    """Refuse, before any work, a file that could not be written: its folder missing, not a
    folder or not writable; the path an existing folder; one of ``inputs`` itself; or,
    unless ``force``, an existing file. Nothing is created."""
    path = Path(path)
    if path.is_dir():
        raise CommandError(f"{option} {path}: is a folder; name a file", EXIT_BAD_INPUT)
    if path.exists() and not path.is_file():
        raise CommandError(f"{option} {path}: exists and is not a regular file", EXIT_BAD_INPUT)
    for source in inputs:
        if path.exists() and Path(source).exists() and path.resolve() == Path(source).resolve():
            raise CommandError(f"{option} {path}: would overwrite the input", EXIT_BAD_INPUT)
    if path.exists() and not force:
        raise CommandError(f"{option} {path}: exists (--force overwrites it)", EXIT_BAD_INPUT)
    _writable_folder(path.parent if str(path.parent) else Path("."), option, path)


def trace_output_file(path: Path, option: str, *, inputs: Iterable[Path] = (), force: bool = False) -> None:
    """``output_file`` for a trace, whose name must also end in ``.safetensors``: a corpus
    folder is scanned for those alone, so a trace named otherwise would be skipped."""
    from traces.format.schema import SUFFIX

    if Path(path).suffix != SUFFIX and not Path(path).is_dir():
        raise CommandError(f"{option} {path}: a trace file's name ends in {SUFFIX} (a corpus folder is scanned for "
                           f"*{SUFFIX} alone)", EXIT_BAD_INPUT)
    output_file(path, option, inputs=inputs, force=force)


def output_folder(path: Path, option: str, *, replaceable: Callable[[Path], bool] | None = None) -> None:
    """Refuse, before any work, a folder that could not be written whole: one that exists
    and is not empty (unless ``replaceable`` says it may be replaced: ``--force``), or is not
    a folder; the current folder (it would be replaced under the shell); or one whose
    parent is missing or not writable."""
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise CommandError(f"{option} {path}: exists and is not a folder", EXIT_BAD_INPUT)
        if any(path.iterdir()) and not (replaceable is not None and replaceable(path)):
            hint = "; --force replaces only an earlier bundle" if replaceable is not None else ""
            raise CommandError(f"{option} {path}: is not an empty folder{hint}", EXIT_BAD_INPUT)
        if path.resolve() == Path.cwd().resolve():
            raise CommandError(f"{option} {path}: is the current folder; name a new or empty one", EXIT_BAD_INPUT)
    _writable_folder(path.resolve().parent, option, path)
