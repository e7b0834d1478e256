"""The ``kda`` Typer application. Commands live in one module each and register here.

Heavy imports (torch, triton, the kernels) happen inside commands, so ``--help`` is fast.
"""

from __future__ import annotations

import os
import sys
import traceback

import typer

from kda_cli.runtime import EXIT_BAD_INPUT, EXIT_RUNTIME, CommandError, make_console, printable

app = typer.Typer(
    name="kda",
    help="Replay, benchmark and reproduce KDA RecoverSSM kernels.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Replay, benchmark and reproduce KDA RecoverSSM kernels.

    Exit codes: 0 match, 1 numerical mismatch, 2 bad input or usage, 3 runtime failure.
    Set KDA_DEBUG=1 for full tracebacks and NO_COLOR=1 for plain output.
    """


def _register() -> None:
    from kda_cli import commands  # noqa: F401  (each module adds its commands to ``app``)


def _print_error(message: str) -> None:
    from rich.markup import escape

    make_console(stderr=True).print(f"[bold red]Error:[/] {escape(printable(message))}", markup=True)


def _usage_error(exc: Exception) -> str:
    """Click's usage error as one line, with where to find the usage."""
    ctx = getattr(exc, "ctx", None)
    where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
    return f"{exc.format_message().rstrip('.')}{where}"


def main() -> None:
    """Entry point: known failures become one ``Error:`` line; ``KDA_DEBUG=1`` shows tracebacks."""
    _register()
    debug = os.environ.get("KDA_DEBUG") == "1"
    try:
        code = app(standalone_mode=False)  # a command's ``typer.Exit(n)`` comes back as ``n``
        if isinstance(code, int) and code:
            sys.exit(code)
    except CommandError as exc:
        if debug:
            traceback.print_exc()
        _print_error(str(exc))
        sys.exit(exc.code)
    except (typer.Exit, SystemExit) as exc:
        code = getattr(exc, "exit_code", None)
        sys.exit(code if code is not None else getattr(exc, "code", 0))
    except typer.Abort:
        _print_error("aborted")
        sys.exit(EXIT_RUNTIME)
    except (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError) as exc:
        # a path the user named cannot be read or written: bad input, not a runtime failure
        if debug:
            traceback.print_exc()
        _print_error(f"cannot use {exc.filename or exc}: {exc.strerror or type(exc).__name__}")
        sys.exit(EXIT_BAD_INPUT)
    except Exception as exc:  # usage errors (click's, vendored by typer) and anything unexpected
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):
            if type(exc).__name__ == "NoArgsIsHelpError":  # a bare group: its help, as usage
                exc.show()
            else:
                _print_error(_usage_error(exc))
            sys.exit(EXIT_BAD_INPUT)
        if debug:
            traceback.print_exc()
        _print_error(f"{type(exc).__name__}: {exc} (KDA_DEBUG=1 shows the traceback)")
        sys.exit(EXIT_RUNTIME)
