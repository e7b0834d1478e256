"""``kda repro``: shrink a failing trace into a bug-report bundle; parsing and rendering only.

The workflow is ``traces.repro.reproduction.reproduce``.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from kda_cli.options import check_format, force_option, output_folder, parse_tolerances
from kda_cli.output import emit, implementation_prints, note, plural
from kda_cli.runtime import (
    EXIT_BAD_INPUT, EXIT_MISMATCH, EXIT_RUNTIME, CommandError, bad_input, interrupted, select_device,
)


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
    atol: List[str] = typer.Option([], "--atol", metavar="[DTYPE=]X", help="DTYPE=X or X, as for kda replay; repeatable."),
    rtol: List[str] = typer.Option([], "--rtol", metavar="[DTYPE=]X", help="DTYPE=X or X, as for kda replay; repeatable."),
    corpus: Optional[Path] = typer.Option(None, "--corpus", help="Also copy the bundle's trace into this corpus "
                                          "folder, named for what it reproduces (op, tensor, kind, hash)."),
    format: str = typer.Option("human", "--format", help="human or json."),
    force: bool = force_option("an earlier bundle in --out"),
) -> None:
    """Shrink a failing trace into a bundle: trace.safetensors, report.md, repro.sh.

    The trace is cut at its first divergence and shrunk while it fails the same way; the
    small trace is checked in a fresh process (through repro.sh) before the bundle is written.

    Exit codes: 1 bundle written, 0 the replay passes (nothing written; 1 when --determinism
    found runs that differ), 2 bad input or usage, 3 runtime failure (also: the small trace
    does not fail the same way in a fresh process), 130/143 stopped by Ctrl-C/SIGTERM
    (nothing written).
    """
    check_format(format)
    if determinism == 1 or determinism < 0:
        raise CommandError(f"--determinism {determinism}: expected 0 (off) or at least 2 runs", EXIT_BAD_INPUT)
    if max_checks < 1:
        raise CommandError(f"--max-checks {max_checks}: must be positive", EXIT_BAD_INPUT)
    tolerances = parse_tolerances(atol, rtol)
    if not trace.is_file():
        raise CommandError(f"{trace}: {'is a folder, not a trace file' if trace.is_dir() else 'no such file'}")
    output_folder(out, "--out", replaceable=_earlier_bundle if force else None)
    if corpus is not None and corpus.exists() and not corpus.is_dir():
        raise CommandError(f"--corpus {corpus}: exists and is not a folder", EXIT_BAD_INPUT)
    device = select_device()

    from traces.repro.bundle import BundleError
    from traces.repro.reproduction import reproduce

    try:
        with bad_input(), implementation_prints(format):
            found = reproduce(trace, out, replace=force, impl=impl, oracle=oracle, device=device,
                              tolerances=tolerances, replay_args=[f"--atol={a}" for a in atol] + [f"--rtol={r}" for r in rtol],
                              determinism=determinism, max_checks=max_checks, corpus=corpus,
                              progress=lambda line: note(f"repro: {line}"))
    except KeyboardInterrupt:
        raise interrupted("nothing written") from None
    except BundleError as exc:
        raise CommandError(str(exc), EXIT_RUNTIME) from None
    except FileExistsError as exc:
        raise CommandError(f"--corpus: {exc} (the bundle is written: {out})", EXIT_BAD_INPUT) from None
    summary = found.to_json()
    emit(summary, format, _render)
    if not found.passed or (found.determinism is not None and not found.determinism.deterministic):
        raise typer.Exit(EXIT_MISMATCH)


def _earlier_bundle(folder: Path) -> bool:
    """``traces.repro.bundle.is_bundle``, imported only when a folder is to be replaced (it imports torch)."""
    from traces.repro.bundle import is_bundle

    return is_bundle(folder)


def _render(s: dict) -> None:
    if s["passed"]:
        print(f"{s['trace']}: replay through {s['impl']} passes; nothing to reproduce")
    else:
        o, d = s["original"], s["shrunk"]
        layer = f", layer {o['layer']}" if "layer" in o else ""
        print(f"{s['trace']}: first divergence at event {o['event']} ({o['op']}, {o['tensor']}, {o['kind']}{layer})")
        print(f"shrunk {plural(s['events'], 'event')} -> {s['shrunk_events']}, "
              f"at most {plural(s['shrunk_rows'], 'row')}, H={s['shrunk_dims']['H']} T={s['shrunk_dims']['T']} ({plural(s['checks'], 'candidate')} tried); "
              f"same divergence at event {d['event']}, also in a fresh process")
        print(f"bundle: {s['bundle']} (trace.safetensors, report.md, repro.sh)")
        if s["corpus_copy"]:
            print(f"corpus: {s['corpus_copy']}")
    runs = s["determinism"]
    if runs:
        verdict = "bitwise identical" if runs["deterministic"] else \
            f"NOT identical: {len(runs['differences'])} differing tensors (a race?)"
        print(f"determinism: {runs['runs']} replays {verdict}")
