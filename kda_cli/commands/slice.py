"""``kda slice``: cut a range of events out of a trace by hand; parsing and rendering only.

The engine is ``traces.slice.cut_events``.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from kda_cli.app import app
from kda_cli.runtime import EXIT_BAD_INPUT, CommandError, bad_input, check_format, select_device


@app.command("slice")
def slice_trace(
    trace: Path = typer.Argument(..., help="Trace file."),
    events: str = typer.Option(..., "--events", help="A:B keeps events A..B-1 (either side may be empty)."),
    out: Path = typer.Option(..., "--out", help="Trace file to write."),
    oracle: str = typer.Option("reference", "--oracle",
                               help="Implementation that runs the events before A to build the initial buffers."),
    format: str = typer.Option("human", "--format", help="human or json."),
) -> None:
    """Cut events A..B-1 out of a trace, with their recorded expected results.

    The initial buffers are the state before A (events before A run through the oracle,
    their recorded results patched in); final buffers are kept only when B is the end.
    """
    from kda_cli.commands.replay import parse_range

    check_format(format)
    if out.exists() and out.resolve() == trace.resolve():
        raise CommandError(f"--out {out}: would overwrite the input trace", EXIT_BAD_INPUT)
    device = select_device()
    from traces.impl import load_impl
    from traces.io import read_trace
    from traces.slice import cut_events
    from traces.tape import Tape

    with bad_input():
        module = load_impl(oracle)
        with read_trace(trace) as opened:
            start, stop = parse_range(events, len(opened.events))
            tape = Tape.load(opened)
        cut = cut_events(tape, start, stop, module, device)
        cut.provenance = {**cut.provenance, "sliced_from": str(trace), "sliced_events": f"{start}:{stop}"}
        cut.write(out)
    summary = {"path": str(out), "source": str(trace), "events": [start, stop], "count": stop - start,
               "final_buffers": bool(cut.final), "file_bytes": out.stat().st_size}
    if format == "json":
        print(json.dumps(summary))
    else:
        print(f"wrote {out}: events {start}:{stop} of {trace} ({stop - start} events, "
              f"{summary['file_bytes'] / 2**20:.2f} MiB)")
