"""``kda synth``: write a synthetic trace; parsing and rendering only (engine: ``traces.synth.simulation``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Optional

import typer

from kda_cli.options import check_format, force_option, trace_output_file
from kda_cli.output import Progress, emit, plural
from kda_cli.runtime import EXIT_BAD_INPUT, CommandError, interrupted, select_device


def synth(
    out: Path = typer.Argument(..., help="Trace file to write (.safetensors)."),
    preset: str = typer.Option("tiny", "--preset", help="k3-tp8 (H=12, K=V=128, T=8) or tiny (H=2, K=V=16, T=4)."),
    mode: Optional[str] = typer.Option(None, "--mode", help="stock, deferred or mixed (default mixed; stock with "
                                                             "--layers or --conv-width, the only mode they have)."),
    requests: int = typer.Option(8, "--requests", help="Requests that arrive over the run."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Cap on decode steps (default: until all finish)."),
    seed: int = typer.Option(0, "--seed"),
    acceptance: float = typer.Option(0.7, "--acceptance", help="Probability that each draft token is accepted."),
    max_batch: int = typer.Option(4, "--max-batch", help="Rows a step, CUDA-graph padding included."),
    slots: Optional[int] = typer.Option(None, "--slots", help="State slots, null slot 0 included (default max-batch + 2)."),
    record_rows: Optional[int] = typer.Option(None, "--record-rows", help="Record rows (default max-batch)."),
    decode_steps: int = typer.Option(6, "--decode-steps", help="Longest request, in decode steps."),
    expected: str = typer.Option("all", "--expected", help="all, outputs (no commit/flush states) or none."),
    note: str = typer.Option("", "--note", help="Free text stored in the provenance."),
    layers: int = typer.Option(1, "--layers", help="KDA layers; more than one (or --conv-width) writes the engine's "
                                                   "commit of every layer, with conv state (format v2, stock mode)."),
    conv_width: Optional[int] = typer.Option(None, "--conv-width", help="Conv width W (default 4 with --layers)."),
    conv_layout: str = typer.Option("dim_first", "--conv-layout", help="dim_first ([N, D, S]) or token_first."),
    format: str = typer.Option("human", "--format", help="human or json."),
    force: bool = force_option("OUT"),
) -> None:
    """Simulate a scheduler and write its events, with float64-reference expected results.

    The file is written whole or not at all; Ctrl-C or SIGTERM leaves nothing (exit 130/143).
    """
    check_format(format)
    from traces.synth.config import SynthConfig, default_mode

    config = SynthConfig(preset=preset, mode=mode or default_mode(layers, conv_width), requests=requests, steps=steps, seed=seed, acceptance=acceptance,
                         max_batch=max_batch, num_slots=slots, num_record_rows=record_rows,
                         max_decode_steps=decode_steps, keep_expected=expected, note=note, layers=layers,
                         conv_width=conv_width, conv_layout=conv_layout)
    try:
        config.check()
    except ValueError as exc:
        raise CommandError(str(exc), EXIT_BAD_INPUT) from None
    trace_output_file(out, "OUT", force=force)
    select_device()  # the reference lives beside the kernels; keep the interpreter choice consistent
    from traces.synth.simulation import synthesize

    with Progress("synth: requests finished", requests) as bar:
        try:
            builder = synthesize(config, progress=bar.update)
        except KeyboardInterrupt:
            raise interrupted(f"{bar.done} of {plural(requests, 'request')} finished; nothing written") from None
    try:
        builder.write(out)
    except KeyboardInterrupt:
        raise interrupted(f"while writing {out}; nothing written") from None
    per_op = Counter(e.op for e in builder.manifest.events)
    summary = {"path": str(out), "file_bytes": out.stat().st_size, "events": len(builder.manifest.events),
               "events_per_op": dict(per_op), "requests": requests}
    emit(summary, format, _render)


def _render(s: dict) -> None:
    ops = ", ".join(f"{op} {n}" for op, n in s["events_per_op"].items())
    print(f"wrote {s['path']}: {plural(s['events'], 'event')} ({ops}), {s['file_bytes'] / 2**20:.2f} MiB")
