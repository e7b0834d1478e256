"""``kda record``: record a command's kernel calls, or merge the shards a crash left;
parsing and rendering only (engine: ``traces.record.recorder``)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import List, Optional

import typer

from kda_cli.options import check_format, force_option, parse_names, trace_output_file
from kda_cli.output import emit, plural, printable
from kda_cli.runtime import EXIT_BAD_INPUT, EXIT_RUNTIME, CommandError, interrupted

record_app = typer.Typer(help="Record kernel calls into a trace; merge shards after a crash.", no_args_is_help=True,
                         rich_markup_mode=None)


def _print(result, format: str, note: str = "", **extra) -> None:
    summary = {"path": str(result.path), "events": result.events, "incomplete_event": result.incomplete,
               "dropped_shards": result.dropped, "dropped_because": result.reason, **extra}

    def human(_: dict) -> None:
        missing = f"; event {result.incomplete} never returned (inputs only)" if result.incomplete is not None else ""
        dropped = f"; {plural(result.dropped, 'shard')} left out ({result.reason})" if result.dropped else ""
        print(printable(f"wrote {result.path}: {plural(result.events, 'event')}{missing}{dropped}{note}"))

    emit(summary, format, human)


@record_app.command("merge")
def merge(
    shards: Path = typer.Argument(..., help="Shards folder (<trace>.shards) left by a process that died."),
    out: Path = typer.Argument(..., help="Trace file to write."),
    format: str = typer.Option("human", "--format", help="human or json."),
    force: bool = force_option("OUT"),
) -> None:
    """Merge the shards a crashed process left into one trace (the shards are kept).

    Every completed event is kept, and the inputs of a call that never returned.
    """
    check_format(format)
    if not shards.is_dir():
        raise CommandError(f"{shards}: {'is not a folder' if shards.exists() else 'no such folder'}")
    trace_output_file(out, "OUT", force=force)
    from traces.record.recorder import RecordError, merge_shards

    try:
        result = merge_shards(shards, out)
    except RecordError as exc:
        raise CommandError(str(exc), EXIT_BAD_INPUT) from None
    except KeyboardInterrupt:
        raise interrupted("nothing written") from None
    _print(result, format)


@record_app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    out: Path = typer.Argument(..., help="Trace file to write."),
    patch: List[str] = typer.Option([], "--patch", metavar="MODULE[,MODULE...]",
                                    help="Module to record without editing the program: its kernel API functions, "
                                         "raw kernels and commit context are wrapped when it is imported (repeat "
                                         "or comma-separate)."),
    layer: int = typer.Option(0, "--layer", help="With --patch: record the N-th set of buffers seen (one per layer), "
                                                  "a trace of format v1."),
    layers: Optional[str] = typer.Option(None, "--layers", metavar="all|N[,N...]",
                                         help="With --patch: record these layers (all, or numbers in the order their "
                                              "buffers were first used) into a trace of format v2, and the engine's "
                                              "commit context (KDARecoverSSMCommitContext) of every layer; an engine "
                                              "with a context of several layers is recorded with --layers all."),
    impl: Optional[str] = typer.Option(None, "--impl",
                                       help="Module the recorder wraps (default: what the program asks for)."),
    ops: Optional[str] = typer.Option(None, "--ops", help="Comma-separated ops to record (default: all)."),
    max_events: Optional[int] = typer.Option(None, "--max-events", help="Stop recording after N events."),
    max_mb: Optional[float] = typer.Option(None, "--max-mb", help="Stop recording past this many MiB of shards."),
    snapshot: str = typer.Option("touched", "--snapshot",
                                 help="touched: slots and record rows at first touch; all: whole pools."),
    graphs: bool = typer.Option(False, "--graphs/--no-graphs",
                                help="--graphs records the verifies a CUDA graph holds at each replay (not yet "
                                     "checked on a GPU); --no-graphs passes captured calls through, recording what "
                                     "replays change as writes."),
    format: str = typer.Option("human", "--format", help="human or json (the command's own output then goes to "
                                                         "stderr)."),
    force: bool = force_option("OUT"),
) -> None:
    """Run a command (after --) with KDA_RECORD=OUT set, and merge what a crash left.

    A program that takes the kernel API from traces.record.recorder.api() is recorded; with --patch,
    an unedited program that imports the named modules is. Without a CUDA device the
    command's Triton kernels run through the interpreter.
    """
    check_format(format)
    for option, value in (("--max-events", max_events), ("--max-mb", max_mb)):
        if value is not None and not 0 < value < math.inf:
            raise CommandError(f"{option} {value:g}: must be a positive number", EXIT_BAD_INPUT)
    if ops is not None and not parse_names([ops]):
        raise CommandError(f"--ops {ops!r}: name at least one op", EXIT_BAD_INPUT)
    if max_mb is not None and max_mb * 2**20 < 1:
        raise CommandError(f"--max-mb {max_mb:g}: less than one byte", EXIT_BAD_INPUT)
    trace_output_file(out, "OUT", force=force)
    from traces.format.exit_status import how_it_ended
    from traces.record.recorder import RecordError, shards_dir
    from traces.record.run import RecordInterrupted, RecordRunError, record_command

    patches = list(parse_names(patch))
    stopped = False
    try:
        run = record_command(out, list(ctx.args), output_to_stderr=format == "json", impl=impl, ops=ops,
                             max_events=max_events, max_mb=max_mb, snapshot=snapshot, patches=patches, layer=layer,
                             layers=layers, graphs=graphs)
    except RecordInterrupted as stop:
        run, stopped = stop.run, True
    except RecordError as exc:
        raise CommandError(str(exc), EXIT_BAD_INPUT) from None
    except RecordRunError as exc:
        raise CommandError(str(exc), EXIT_RUNTIME) from None
    if run.interpreter and format != "json":
        print("kda record: no CUDA device: the command's Triton kernels ran through the interpreter "
              "(TRITON_INTERPRET=1)", file=sys.stderr)
    code = run.exit_status
    if run.result is not None:
        note = f" (merged from {shards_dir(out)} after the command {how_it_ended(code)})" \
            if run.merged_from_shards else ""
        _print(run.result, format, note, exit_status=code, interpreter=run.interpreter)
    if stopped:
        kept = f"{plural(run.result.events, 'event')} recorded, in {out}" if run.result is not None else \
            "nothing recorded"
        raise interrupted(f"the command was stopped; {kept}")
    if code != 0:
        raise CommandError(f"the command {how_it_ended(code)}", EXIT_RUNTIME)
    if run.result is None:
        hint = f"was {', '.join(patches)} imported?" if patches else \
            "does the program take the kernel API from traces.record.recorder.api(), or name its module with --patch?"
        raise CommandError(f"nothing was recorded: {hint}", EXIT_RUNTIME)
