"""``kda repro``: shrink a failing trace into a bug-report bundle; parsing and rendering only.

Engines: ``traces.shrink`` (minimizer), ``traces.determinism``, ``traces.bundle``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List

import typer

from kda_cli.app import app
from kda_cli.runtime import (
    EXIT_BAD_INPUT, EXIT_MISMATCH, EXIT_RUNTIME, CommandError, bad_input, check_format, select_device,
)


@app.command()
def repro(
    trace: Path = typer.Argument(..., help="A trace whose replay fails."),
    out: Path = typer.Option(..., "--out", help="Bundle folder to write (must not exist, or be empty)."),
    impl: str = typer.Option("triton", "--impl",
                             help="Implementation that fails: triton, reference, a module or a .py file."),
    oracle: str = typer.Option("reference", "--oracle",
                               help="Implementation that regenerates expected results while shrinking."),
    determinism: int = typer.Option(0, "--determinism",
                                    help="Also replay N times (N >= 2) and report bitwise differences."),
    max_checks: int = typer.Option(400, "--max-checks", help="Most candidate traces to try while shrinking."),
    atol: List[str] = typer.Option([], "--atol", help="DTYPE=X or X, as for kda replay; repeatable."),
    rtol: List[str] = typer.Option([], "--rtol", help="DTYPE=X or X, as for kda replay; repeatable."),
    format: str = typer.Option("human", "--format", help="human or json."),
) -> None:
    """Shrink a failing trace into a bundle: trace.safetensors, report.md, repro.sh.

    The trace is cut at its first divergence and shrunk while it fails the same way; the
    small trace is checked in a fresh process before the bundle is written.

    Exit codes: 1 bundle written, 0 the replay passes (nothing written), 2 bad input or
    usage, 3 runtime failure (also: the small trace does not fail the same way in a fresh process).
    """
    from kda_cli.commands.replay import parse_tolerances

    check_format(format)
    if determinism == 1 or determinism < 0:
        raise CommandError(f"--determinism {determinism}: expected 0 (off) or at least 2 runs", EXIT_BAD_INPUT)
    if max_checks < 1:
        raise CommandError("--max-checks must be positive", EXIT_BAD_INPUT)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CommandError(f"--out {out}: exists and is not an empty folder", EXIT_BAD_INPUT)
    tolerances = parse_tolerances(atol, rtol)
    device = select_device()

    from traces.bundle import BundleError, write_bundle
    from traces.determinism import check_determinism
    from traces.impl import load_impl
    from traces.io import read_trace
    from traces.schema import TraceError
    from traces.shrink import shrink
    from traces.tape import Tape

    with bad_input():
        module, reference = load_impl(impl), load_impl(oracle)
        with read_trace(trace) as opened:
            tape = Tape.load(opened)
        runs = check_determinism(tape, module, determinism, device) if determinism else None
        result = shrink(trace, module, reference, device=device, tolerances=tolerances, max_checks=max_checks,
                        progress=lambda line: print(line, file=sys.stderr))
    summary = {"trace": str(trace), "impl": impl, "device": device, "events": len(tape.steps),
               "determinism": runs.to_json() if runs else None}
    if result is None:
        summary.update(passed=True, bundle=None)
        _render(summary, format)
        if runs is not None and not runs.deterministic:
            raise typer.Exit(EXIT_MISMATCH)
        return
    replay_args = [f"--atol={a}" for a in atol] + [f"--rtol={r}" for r in rtol]
    try:
        recheck = write_bundle(out, result, source=trace, impl=impl, replay_args=replay_args,
                               original_events=len(tape.steps), determinism=runs)
    except BundleError as exc:
        raise CommandError(str(exc), EXIT_RUNTIME) from None
    except TraceError as exc:
        raise CommandError(f"the shrunk trace cannot be written: {exc}", EXIT_RUNTIME) from None
    small = result.tape
    summary.update(passed=False, bundle=str(out), original=result.original.to_json(),
                   shrunk=result.divergence.to_json(),
                   shrunk_events=len(small.steps), shrunk_rows=max(s.batch for s in small.steps),
                   shrunk_dims={"H": small.dims.H, "K": small.dims.K, "V": small.dims.V, "T": small.dims.T},
                   checks=result.checks, history=result.history, fresh_process_exit=recheck.returncode)
    _render(summary, format)
    raise typer.Exit(EXIT_MISMATCH)


def _render(s: dict, format: str) -> None:
    if format == "json":
        print(json.dumps(s))
        return
    if s["passed"]:
        print(f"{s['trace']}: replay through {s['impl']} passes; nothing to reproduce")
    else:
        o, d = s["original"], s["shrunk"]
        print(f"{s['trace']}: first divergence at event {o['event']} ({o['op']}, {o['tensor']}, {o['kind']})")
        print(f"shrunk {s['events']} events -> {s['shrunk_events']}, at most {s['shrunk_rows']} rows, "
              f"H={s['shrunk_dims']['H']} T={s['shrunk_dims']['T']} ({s['checks']} candidates tried); "
              f"same divergence at event {d['event']}, also in a fresh process")
        print(f"bundle: {s['bundle']} (trace.safetensors, report.md, repro.sh)")
    runs = s["determinism"]
    if runs:
        verdict = "bitwise identical" if runs["deterministic"] else \
            f"NOT identical: {len(runs['differences'])} differing tensors (a race?)"
        print(f"determinism: {runs['runs']} replays {verdict}")
