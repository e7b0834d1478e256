"""``kda slice``: cut a range of events out of a trace by hand; parsing and rendering only.

The engine is ``traces.repro.slice.cut_events``.
"""

from __future__ import annotations

from pathlib import Path

import typer

from kda_cli.options import check_format, force_option, parse_range, resolve_range, trace_output_file
from kda_cli.output import Progress, emit, plural
from kda_cli.runtime import bad_input, interrupted, select_device


def slice_trace(
    trace: Path = typer.Argument(..., help="Trace file."),
    events: str = typer.Option(..., "--events", help="A:B keeps events A..B-1 (either side may be empty)."),
    out: Path = typer.Option(..., "--out", help="Trace file to write (its folder must exist)."),
    oracle: str = typer.Option("reference", "--oracle",
                               help="Implementation that runs the events before A to build the initial buffers."),
    format: str = typer.Option("human", "--format", help="human or json."),
    force: bool = force_option("the --out file"),
) -> None:
    """Cut events A..B-1 out of a trace, with their recorded expected results.

    The initial buffers are the state before A (events before A run through the oracle,
    their recorded results patched in); final buffers are kept only when B is the end. The
    file is written whole or not at all; Ctrl-C or SIGTERM leaves nothing (exit 130/143).
    """
    check_format(format)
    parse_range(events)
    trace_output_file(out, "--out", inputs=[trace], force=force)
    device = select_device()
    from traces.impl.loader import load_impl
    from traces.format.io import read_trace
    from traces.repro.slice import cut_events
    from traces.format.tape import Tape

    try:
        with bad_input():
            module = load_impl(oracle, "--oracle")
            with read_trace(trace) as opened:
                start, stop = resolve_range(events, len(opened.events))
                tape = Tape.load(opened)
            with Progress(f"slice: events run through {oracle} to build the initial buffers", start) as bar:
                cut = cut_events(tape, start, stop, module, device, progress=bar.update)
            cut.provenance = {**cut.provenance, "sliced_from": str(trace), "sliced_events": f"{start}:{stop}"}
            cut.write(out)
    except KeyboardInterrupt:
        raise interrupted("nothing written") from None
    summary = {"path": str(out), "source": str(trace), "events": [start, stop], "count": stop - start,
               "final_buffers": bool(cut.final), "file_bytes": out.stat().st_size}
    emit(summary, format, _render)


def _render(s: dict) -> None:
    start, stop = s["events"]
    print(f"wrote {s['path']}: events {start}:{stop} of {s['source']} ({plural(s['count'], 'event')}, "
          f"{s['file_bytes'] / 2**20:.2f} MiB)")
