"""``kda replay``: replay a trace through an implementation; parsing and rendering only.

The engine is ``traces.replay.engine``; comparisons are ``traces.replay.compare``.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import List, Optional

import typer

from kda_cli.options import check_format, force_option, parse_ints, parse_range, parse_tolerances, resolve_range
from kda_cli.output import (
    PIPE_WIDTH, Progress, duration, emit, implementation_prints, make_console, note, plural, printable, routes_text,
)
from kda_cli.runtime import EXIT_MISMATCH, EXIT_RUNTIME, CommandError, bad_input, interrupted, select_device
from kda_cli.sample import trace_path

MAX_DETAILED = 10
"""Failing tensors shown with their first and worst element in the human report."""

HINT_SECONDS = 30.0
"""An interpreter run estimated longer than this gets the hint to replay through the reference."""


def replay(
    context: typer.Context,
    trace: Optional[Path] = typer.Argument(None, metavar="TRACE...", help="Trace file, or several files and folders "
                                           "(a corpus: their *.safetensors); the shipped Kimi-K3 sample when omitted."),
    impl: str = typer.Option("triton", "--impl", help="triton, reference, a module name or a .py file path."),
    format: str = typer.Option("human", "--format", help="human or json."),
    stop_at_first: bool = typer.Option(False, "--stop-at-first", help="Stop after the first event with a mismatch."),
    events: Optional[str] = typer.Option(None, "--events", help="Compare events A:B only (earlier ones still run)."),
    layers: Optional[str] = typer.Option(None, "--layers", help="Compare layers I,J,... only (every layer runs)."),
    atol: List[str] = typer.Option([], "--atol", metavar="[DTYPE=]X", help="DTYPE=X or X for every float dtype; repeatable."),
    rtol: List[str] = typer.Option([], "--rtol", metavar="[DTYPE=]X", help="DTYPE=X or X for every float dtype; repeatable."),
    progress: bool = typer.Option(True, "--progress/--no-progress",
                                  help="Progress on stderr: a bar on a terminal, else a line every few seconds."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Corpus: worker processes (default: one per "
                                          "visible GPU, or per CPU core under the Triton interpreter)."),
    junit_xml: Optional[Path] = typer.Option(None, "--junit-xml", help="Corpus: write a JUnit XML report here."),
    ray: Optional[str] = typer.Option(None, "--ray", metavar="ADDRESS",
                                      help="Corpus: one Ray task per trace on the cluster at ADDRESS (auto, "
                                           "ray://host:port, or local for a Ray instance started here)."),
    ray_ship: bool = typer.Option(False, "--ray-ship", help="Corpus on Ray: send each trace's bytes with its task "
                                                            "(default: tasks read the path, on a shared file system)."),
    force: bool = force_option("the --junit-xml file"),
) -> None:
    """Replay a trace's events and compare every result with the recorded one.

    Several traces, a folder, or any corpus option replays a corpus: one line per trace as it
    finishes, then a summary; the exit code is the worst trace's.

    Exit codes: 0 match, 1 mismatch, 2 bad input or usage, 3 runtime failure, 130/143 stopped by
    Ctrl-C/SIGTERM (the events compared so far are summarised first).
    """
    check_format(format)
    tolerances = parse_tolerances(atol, rtol)
    parse_range(events)  # refuse a malformed range before any heavy import
    compared_layers = frozenset(parse_ints("--layers", layers, minimum=0)) if layers is not None else None
    traces = [trace, *map(Path, context.args)] if trace is not None else []  # more traces: extra arguments
    if len(traces) > 1 or any(t.is_dir() for t in traces) or workers is not None or junit_xml or ray or ray_ship:
        if events is not None or layers is not None:
            option = "--events selects events" if events is not None else "--layers selects layers"
            raise CommandError(f"{option} of one trace; a corpus replays every event")
        from kda_cli.commands.replay_corpus import replay_corpus

        return replay_corpus(traces, impl=impl, format=format, stop_at_first=stop_at_first, tolerances=tolerances,
                             workers=workers, junit_xml=junit_xml, ray=ray, ship=ray_ship, force=force)
    if trace is not None and not trace.is_file():
        raise CommandError(f"{trace}: {'is a folder, not a trace file' if trace.is_dir() else 'no such file'}")
    device = select_device()  # before the kernels are imported

    from traces.impl.loader import load_impl
    from traces.format.io import read_trace
    from traces.replay.engine import ReplayFailure, ReplayInterrupted, replay as run_replay
    from traces.replay.cost import event_units, runs_triton

    with ExitStack() as stack:
        stack.enter_context(bad_input())
        opened = stack.enter_context(read_trace(stack.enter_context(trace_path(trace))))
        span = resolve_range(events, len(opened.events))
        with implementation_prints(format):
            module = load_impl(impl)
        units = event_units(opened)[:span[1]]
        if progress and device == "cpu" and runs_triton(module):
            note(_interpreter_estimate(units, impl))
        bar = stack.enter_context(Progress("replay", span[1], enabled=progress, weights=units))
        try:
            with implementation_prints(format):
                report = run_replay(opened, module, device=device, impl_name=impl, tolerances=tolerances,
                                    events=span, stop_at_first=stop_at_first, progress=bar.update,
                                    layers=compared_layers)
        except ReplayFailure as exc:
            raise CommandError(f"{impl} failed at {exc}", EXIT_RUNTIME) from None
        except ReplayInterrupted as stop:
            report = stop.report
            bar.__exit__(None, None, None)
            _emit(report, opened.manifest, format, interrupted=True)
            done = f"{plural(bar.done, 'event')} of {span[1]} run"
            raise interrupted(f"{done}; the summary above covers those compared") from None
    _emit(report, opened.manifest, format)
    if not report.passed:
        raise typer.Exit(EXIT_MISMATCH)


def _interpreter_estimate(units: list[float], impl: str) -> str:
    """Before an interpreter run: how long it may take, and the faster way where it fits."""
    from traces.replay.cost import rough_seconds

    seconds = rough_seconds(sum(units))
    hint = "; --impl reference replays it in seconds (it checks the trace, not the Triton kernels)" \
        if impl == "triton" and seconds > HINT_SECONDS else ""
    return (f"replay: {plural(len(units), 'event')} through the Triton interpreter (no CUDA device): roughly "
            f"{duration(seconds)} on a 2-core CPU, by the trace's sizes{hint}")


def _emit(report, manifest, format: str, interrupted: bool = False) -> None:
    """The report; a stopped replay never reports passed (what it did not compare may fail)."""
    data = {**report.to_json(), "interrupted": interrupted}
    data["passed"] = data["passed"] and not interrupted
    emit(data, format, lambda _: _render(report, manifest, interrupted))


def _g(x) -> str:
    return "-" if x is None else f"{x:.2e}" if isinstance(x, float) and x else str(x)


def _where(bad) -> str:
    return " ".join(f"{k}={v}" for k, v in bad.coords.items())


def _render(report, manifest, interrupted: bool = False) -> None:
    from rich.markup import escape
    from rich.table import Table

    console = make_console(pipe_width=PIPE_WIDTH)
    d = manifest.dims
    a, b = report.event_range
    console.print(f"trace {escape(printable(report.trace))}")
    console.print(f"impl {report.impl} on {report.device}"
                  f"{' (Triton interpreter)' if report.device == 'cpu' and report.impl == 'triton' else ''}; "
                  f"H={d.H} K={d.K} V={d.V} T={d.T}, {manifest.activation_dtype} activations, "
                  f"{manifest.state_dtype} state; events {a}:{b} of {len(manifest.events)}"
                  f"{' (stopped at the first mismatch)' if report.stopped_early else ''}")
    console.print("ops through: " + escape(printable(routes_text(report.routes))))
    tol = "; ".join(f"{k} atol={t.atol:g} rtol={t.rtol:g}" for k, t in report.tolerances.items())
    console.print(f"tolerances: {tol}; integers and records.key_gate exact")
    if interrupted and not report.events:
        console.print("STOPPED before the first compared event finished: nothing to report")
        return

    per_tensor: dict[tuple[str, str], dict] = {}
    for e in report.events:
        for c in e.comparisons:
            row = per_tensor.setdefault((e.op, c.role), {"n": 0, "abs": 0.0, "rel": 0.0, "rmse": 0.0, "ulp": None,
                                                          "bad": 0, "bad_events": 0})
            row["n"] += 1
            row["abs"], row["rel"], row["rmse"] = max(row["abs"], c.max_abs), max(row["rel"], c.max_rel), \
                max(row["rmse"], c.rel_rmse)
            if c.max_ulp is not None:
                row["ulp"] = max(row["ulp"] or 0, c.max_ulp)
            row["bad"] += c.mismatches
            row["bad_events"] += 0 if c.passed else 1
    for c in report.final:
        per_tensor[("final", c.role)] = {"n": 1, "abs": c.max_abs, "rel": c.max_rel, "rmse": c.rel_rmse,
                                         "ulp": c.max_ulp, "bad": c.mismatches, "bad_events": 0 if c.passed else 1}

    summary = report.summary()
    ops = Table(title="per op", title_justify="left")
    for col in ("op", "events", "tensors", "bad events", "median ms"):
        ops.add_column(col, justify="left" if col == "op" else "right")
    for op, row in summary.items():
        ms = "n/a" if not report.timed else _g(row["median_ms"])
        ops.add_row(op, str(row["events"]), str(row["tensors"]), str(row["mismatched_events"]), ms)
    console.print(ops)
    for op, row in summary.items():
        if not row["tensors"]:
            console.print(f"{op}: {plural(row['events'], 'event')} with no recorded results; they ran, to carry "
                          "the buffers forward, but there was nothing to compare")
    if not report.timed:
        console.print("timings: n/a, not on a GPU (the Triton interpreter and the CPU say nothing about kernel speed)")

    tensors = Table(title="per tensor (worst over events)", title_justify="left")
    for col in ("op", "tensor", "events", "max abs", "max rel", "rel rmse", "ulp", "mismatches"):
        tensors.add_column(col, justify="left" if col in ("op", "tensor") else "right")
    for (op, role), row in per_tensor.items():
        tensors.add_row(op, role, str(row["n"]), _g(row["abs"]), _g(row["rel"]), _g(row["rmse"]), _g(row["ulp"]),
                        str(row["bad"]))
    console.print(tensors)

    failing = [c for c in report.comparisons if not c.passed]
    for c in failing[:MAX_DETAILED]:
        console.print(f"[red]mismatch[/] {escape(printable(c.tensor))}: {c.mismatches} of {c.compared} elements "
                      f"(atol={c.tolerance.atol:g} rtol={c.tolerance.rtol:g})")
        for label, bad in (("first", c.first_bad), ("worst", c.worst_bad)):
            console.print(f"  {label}: {escape(_where(bad))}: actual {bad.actual:.6g}, expected {bad.expected:.6g}")
    if len(failing) > MAX_DETAILED:
        console.print(f"... and {len(failing) - MAX_DETAILED} more failing tensors (--format json lists all)")
    compared = len(report.comparisons)
    if interrupted:
        verdict = f"[red]{len(failing)} mismatch[/]" if failing else "no mismatch so far"
        console.print(f"STOPPED after {plural(len(report.events), 'compared event')}: {compared} tensors compared, "
                      f"{verdict}")
    elif not compared:
        console.print("PASS (vacuous): the trace holds no expected results or final buffers to compare")
    elif report.passed:
        console.print(f"[green]PASS[/]: {compared} tensors compared over {plural(len(report.events), 'event')}, "
                      "all within tolerance")
    else:
        console.print(f"[red]FAIL[/]: {len(failing)} of {compared} tensors mismatch")
