"""``kda replay`` of several traces or a folder (a corpus); parsing and rendering only.

The runners are ``traces.corpus.pool`` (worker processes on this host) and
``traces.corpus.ray_tasks`` (tasks on a Ray cluster); the JUnit report is ``traces.corpus.junit``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from kda_cli.options import output_file
from kda_cli.output import PIPE_WIDTH, emit, implementation_prints, make_console, plural, printable
from kda_cli.runtime import CommandError, bad_input, interrupted, select_device

MARKS = {"passed": "[green]PASS[/]", "mismatch": "[red]FAIL[/]", "raised": "[red]RAISED[/]",
         "crashed": "[red]CRASHED[/]", "refused": "[yellow]REFUSED[/]"}
"""How a trace's line starts, by outcome (``traces.corpus.run.OUTCOME_CODES``)."""


def replay_corpus(paths: list[Path], *, impl: str, format: str, stop_at_first: bool, tolerances: dict,
                  workers: Optional[int], junit_xml: Optional[Path], ray: Optional[str], ship: bool,
                  force: bool = False) -> None:
    """Replay every trace of ``paths`` (files, folders); one line per trace as it finishes,
    then the summary (stdout; the lines go to stderr under ``--format json``), exit code the
    worst trace's; interrupted: the partial summary, then 130/143. An existing ``junit_xml``
    is refused before any work unless ``force``."""
    if not paths:
        raise CommandError("--workers, --junit-xml and --ray replay a corpus: name its traces or folders")
    if workers is not None and workers < 1:
        raise CommandError(f"--workers {workers}: must be at least 1")
    if ship and not ray:
        raise CommandError("--ray-ship ships traces to Ray tasks; it needs --ray")
    if junit_xml is not None:
        output_file(junit_xml, "--junit-xml", inputs=paths, force=force)
    from traces.corpus.run import CorpusError, ReplaySettings, find_traces
    from traces.corpus.junit import write_junit

    console = make_console(stderr=format == "json", pipe_width=PIPE_WIDTH)
    settings = ReplaySettings(impl, tolerances, stop_at_first)

    def show(result) -> None:
        console.print(_line(result))

    try:
        traces = find_traces(paths)
        if ray:
            from traces.corpus.ray_tasks import run_ray

            run = run_ray(traces, settings, address=ray, ship=ship, workers=workers, on_result=show)
        else:
            device = select_device()
            from traces.corpus.pool import run_pool
            from traces.impl.loader import load_impl

            with bad_input(), implementation_prints(format):
                load_impl(impl)  # a bad --impl is refused once, before any worker starts
            run = run_pool(traces, settings, device=device, workers=workers, on_result=show)
    except CorpusError as exc:
        raise CommandError(str(exc)) from None
    if junit_xml is not None:
        write_junit(junit_xml, run)
    emit(run.to_json(), format, lambda _: _render(run))
    if run.interrupted:
        raise interrupted(f"{len(run.results)} of {plural(len(run.traces), 'trace')} replayed; "
                          "the summary above covers those")
    if run.exit_code:
        raise typer.Exit(run.exit_code)


def _line(result) -> str:
    from rich.markup import escape

    head = f"{MARKS[result.outcome]} {escape(printable(result.trace))} ({result.seconds:.2f} s, {result.worker or '-'})"
    return head + (f": {escape(printable(result.message))}" if result.message else "")


def _render(run) -> None:
    from rich.markup import escape
    from rich.table import Table

    from traces.corpus.run import FAILED

    console = make_console(pipe_width=PIPE_WIDTH)
    counts = run.counts()
    table = Table(title=f"{plural(len(run.traces), 'trace')} through {run.where}, "
                        f"{plural(run.workers, 'worker')}", title_justify="left")
    table.add_column("outcome")
    table.add_column("traces", justify="right")
    failed = sum(counts[outcome] for outcome in FAILED)
    rows = [("passed", counts["passed"]),
            (f"failed (mismatch {counts['mismatch']}, raised {counts['raised']}, crashed {counts['crashed']})",
             failed),
            ("refused (damaged or unreadable)", counts["refused"])]
    if counts["not_run"]:
        rows.append(("not run (interrupted)", counts["not_run"]))
    for label, n in rows:
        table.add_row(label, str(n))
    console.print(table)
    slowest = run.slowest()
    spent = sum(r.seconds for r in run.results)
    console.print(f"time: {run.seconds:.1f} s wall, {spent:.1f} s of trace replays"
                  + (f"; slowest {escape(printable(slowest.trace))} ({slowest.seconds:.2f} s)" if slowest else ""))
    if run.interrupted:
        console.print(f"STOPPED after {len(run.results)} of {plural(len(run.traces), 'trace')}: "
                      f"{counts['passed']} passed, {failed} failed, {counts['refused']} refused")
    elif failed or counts["refused"]:
        console.print(f"[red]FAIL[/]: {failed} failed and {counts['refused']} refused of "
                      f"{plural(len(run.traces), 'trace')}")
    else:
        console.print(f"[green]PASS[/]: all {plural(len(run.traces), 'trace')} passed")
