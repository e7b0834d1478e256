"""The ``kda`` Typer application: every command is registered here, one way; command modules
never import this module.

Heavy imports (torch, triton, the kernels) happen inside commands, after their arguments are
checked, so ``--help`` and a bad argument are fast.
"""

from __future__ import annotations

import os
import sys
import traceback

import typer

from kda_cli.commands import bench, info, record, replay, repro, synth, version
from kda_cli.commands import slice as slice_command
from kda_cli.runtime import EXIT_BAD_INPUT, EXIT_RUNTIME, CommandError, interrupted, stop_signals

app = typer.Typer(
    name="kda",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help: flags read as flags with every Typer version
    context_settings={"help_option_names": ["-h", "--help"]},  # every command's, as they inherit it
)


def _version(shown: bool) -> None:
    """``kda --version``: kda's own version, at once (``kda version`` adds torch, triton, the GPU)."""
    if shown:
        from importlib import metadata

        from kda_cli.environment import DISTRIBUTION

        try:
            print(f"kda {metadata.version(DISTRIBUTION)}")
        except metadata.PackageNotFoundError:
            print(f"kda (not installed: {DISTRIBUTION} has no metadata here)")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                       help="Print kda's version and exit (kda version: torch, triton, the GPU too)."),
          ) -> None:
    """Replay, benchmark and reproduce KDA RecoverSSM kernels.

    Exit codes: 0 match, 1 numerical mismatch, 2 bad input or usage, 3 runtime failure,
    130/143 stopped by Ctrl-C/SIGTERM. Set KDA_DEBUG=1 for full tracebacks and NO_COLOR=1
    for plain output.
    """


app.command()(version.version)
app.command()(info.info)
app.command(context_settings={"allow_extra_args": True})(replay.replay)  # several traces: a corpus
app.command()(synth.synth)
app.command("slice")(slice_command.slice_trace)
app.command()(repro.repro)
app.command()(bench.bench)
app.add_typer(record.record_app, name="record")


def _print_error(message: str) -> None:
    from rich.markup import escape

    from kda_cli.output import make_console, printable

    make_console(stderr=True).print(f"[bold red]Error:[/] {escape(printable(message))}", markup=True)


def _print_traceback(exc: BaseException) -> None:
    """``exc``'s traceback after those of the exceptions it came from, those it was raised
    ``from None`` over included: an implementation's own frames are where the fault is."""
    seen, link = set(), exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        link.__suppress_context__ = False
        link = link.__cause__ or link.__context__
    traceback.print_exception(exc)


def _usage_error(exc: Exception) -> str:
    """Click's usage error as one line, with where to find the usage."""
    ctx = getattr(exc, "ctx", None)
    where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
    return f"{exc.format_message().rstrip('.')}{where}"


def main() -> None:
    """Entry point: known failures become one ``Error:`` line; ``KDA_DEBUG=1`` shows tracebacks;
    a reader that goes away (a closed pipe) changes no exit code."""
    from kda_cli.output import closed_pipes_ignored

    with closed_pipes_ignored():
        _main(os.environ.get("KDA_DEBUG") == "1")


def _invoke(args: list[str]) -> None:
    """Run the command ``args`` name, as click's own ``main`` would, without the handling it
    adds: Ctrl-C and SIGTERM (Typer turns them into exit 130 alike), closed pipes (exit 1)."""
    import typer.main

    command = typer.main.get_command(app)
    with command.make_context("kda", args) as ctx:
        command.invoke(ctx)


def _main(debug: bool) -> None:
    from kda_cli.environment import check_imports

    try:
        with stop_signals():
            check_imports()
            _invoke(sys.argv[1:])
    except KeyboardInterrupt:  # a command without a partial summary of its own
        error = interrupted()
        _print_error(str(error))
        sys.exit(error.code)
    except CommandError as exc:
        if debug:
            _print_traceback(exc)
        _print_error(str(exc))
        sys.exit(exc.code)
    except (typer.Exit, SystemExit) as exc:
        code = getattr(exc, "exit_code", None)
        sys.exit(code if code is not None else getattr(exc, "code", 0))
    except typer.Abort:  # click turns Ctrl-C inside a prompt into Abort
        error = interrupted()
        _print_error(str(error))
        sys.exit(error.code)
    except (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError) as exc:
        # a path the user named cannot be read or written: bad input, not a runtime failure
        if debug:
            _print_traceback(exc)
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
            _print_traceback(exc)
        _print_error(f"{type(exc).__name__}: {exc} (KDA_DEBUG=1 shows the traceback)")
        sys.exit(EXIT_RUNTIME)
