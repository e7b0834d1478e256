"""``kda record``: record a command's kernel calls, or merge the shards a crash left;
parsing and rendering only (engine: ``traces.record``)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import List, Optional

import typer

from kda_cli.app import app
from kda_cli.runtime import EXIT_BAD_INPUT, EXIT_RUNTIME, CommandError, check_format, printable

record_app = typer.Typer(help="Record kernel calls into a trace; merge shards after a crash.", no_args_is_help=True)
app.add_typer(record_app, name="record")


def _print(result, format: str, note: str = "", **extra) -> None:
    summary = {"path": str(result.path), "events": result.events, "incomplete_event": result.incomplete,
               "dropped_shards": result.dropped, "dropped_because": result.reason, **extra}
    if format == "json":
        print(json.dumps(summary))
        return
    extra = f"; event {result.incomplete} never returned (inputs only)" if result.incomplete is not None else ""
    dropped = f"; {result.dropped} shards left out ({result.reason})" if result.dropped else ""
    print(printable(f"wrote {result.path}: {result.events} events{extra}{dropped}{note}"))


@record_app.command("merge")
def merge(
    shards: Path = typer.Argument(..., help="Shards folder (<trace>.shards) left by a process that died."),
    out: Path = typer.Argument(..., help="Trace file to write."),
    format: str = typer.Option("human", "--format", help="human or json."),
) -> None:
    """Merge the shards a crashed process left into one trace (the shards are kept).

    Every completed event is kept, and the inputs of a call that never returned.
    """
    check_format(format)
    from traces.record import RecordError, merge_shards

    try:
        result = merge_shards(shards, out)
    except RecordError as exc:
        raise CommandError(str(exc), EXIT_BAD_INPUT) from None
    _print(result, format)


@record_app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    out: Path = typer.Argument(..., help="Trace file to write."),
    impl: Optional[str] = typer.Option(None, "--impl",
                                       help="Module the recorder wraps (default: what the program asks for)."),
    ops: Optional[str] = typer.Option(None, "--ops", help="Comma-separated ops to record (default: all)."),
    max_events: Optional[int] = typer.Option(None, "--max-events", help="Stop recording after N events."),
    max_mb: Optional[float] = typer.Option(None, "--max-mb", help="Stop recording past this many MiB of shards."),
    snapshot: str = typer.Option("touched", "--snapshot",
                                 help="touched: slots and record rows at first touch; all: whole pools."),
    format: str = typer.Option("human", "--format", help="human or json."),
) -> None:
    """Run a command (after --) with KDA_RECORD=OUT set, and merge what a crash left.

    A program that takes the kernel API from traces.record.api() is recorded.
    """
    command: List[str] = list(ctx.args)
    if not command:
        raise CommandError("no command to run: kda record run OUT -- COMMAND [ARGS]", EXIT_BAD_INPUT)
    check_format(format)
    from traces.record import MergeResult, RecordError, merge_shards, shards_dir

    if shards_dir(out).exists():
        raise CommandError(f"{shards_dir(out)} exists: merge it (kda record merge) or remove it first", EXIT_BAD_INPUT)
    env = dict(os.environ, KDA_RECORD=str(out.resolve()), KDA_RECORD_SNAPSHOT=snapshot)
    for var, value in (("KDA_RECORD_IMPL", impl), ("KDA_RECORD_OPS", ops), ("KDA_RECORD_MAX_EVENTS", max_events),
                       ("KDA_RECORD_MAX_MB", max_mb)):
        if value is not None:
            env[var] = str(value)
    try:
        code = subprocess.call(command, env=env)
    except OSError as exc:
        raise CommandError(f"cannot run {command[0]}: {exc}", EXIT_BAD_INPUT) from None
    if shards_dir(out).exists():  # the program died before the recorder could merge
        try:
            result = merge_shards(shards_dir(out), out)
        except RecordError as exc:
            raise CommandError(f"the command exited with status {code}; {exc}", EXIT_RUNTIME) from None
        _print(result, format, f" (merged from {shards_dir(out)} after the command exited with status {code})",
               exit_status=code)
    elif out.exists():  # the recorder merged its shards when the program exited
        from traces.io import read_trace
        from traces.schema import TraceError

        try:
            with read_trace(out) as trace:
                events = len(trace.events)
        except TraceError as exc:
            raise CommandError(f"the command exited with status {code} and left {out}, not a trace: {exc}",
                               EXIT_RUNTIME) from None
        _print(MergeResult(out, events, None, 0), format, exit_status=code)
    if code != 0:
        raise CommandError(f"the command exited with status {code}", EXIT_RUNTIME)
    if not out.exists():
        raise CommandError("nothing was recorded: does the program take the kernel API from traces.record.api()?",
                           EXIT_RUNTIME)
