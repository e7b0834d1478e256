"""``kda info``: what a trace holds, from its manifest; parsing and rendering only."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Optional

import typer

from kda_cli.options import check_format
from kda_cli.output import emit, human_value, make_console, printable
from kda_cli.runtime import bad_input
from kda_cli.sample import trace_path


def trace_summary(trace) -> dict:
    """The manifest's facts and counts, as plain JSON types."""
    from traces.format.schema import FORMAT_NAME

    m = trace.manifest
    per_op = Counter(e.op for e in m.events)
    with_expected = Counter(e.op for e in m.events if e.expected)
    return {
        "path": str(trace.path), "file_bytes": trace.path.stat().st_size, "tensors": len(trace.names),
        "format": FORMAT_NAME, "version": m.version,
        "layers": m.num_layers, "conv": None if m.conv is None else m.conv.to_json(),
        "dims": {"H": m.dims.H, "K": m.dims.K, "V": m.dims.V, "T": m.dims.T},
        "dtypes": {"activation": m.activation_dtype, "state": m.state_dtype},
        "lower_bound": m.lower_bound, "null_id": m.null_id,
        "buffers": {"num_slots": m.sizes.num_slots, "num_record_rows": m.sizes.num_record_rows,
                    "plan_rows": m.sizes.plan_rows},
        "events": len(m.events),
        "events_per_op": dict(per_op), "events_with_expected": dict(with_expected),
        "events_from_graph_replays": sum("graph_replay" in e.attrs for e in m.events),
        "final_buffers": bool(m.final), "provenance": m.provenance,
    }


def info(
    trace: Optional[Path] = typer.Argument(None, help="Trace file; the shipped Kimi-K3 sample when omitted."),
    format: str = typer.Option("human", "--format", help="human or json."),
) -> None:
    """Summarise a trace: shapes, dtypes, buffer sizes, events per op, provenance."""
    check_format(format)
    from traces.format.io import read_trace

    with bad_input(), trace_path(trace) as path, read_trace(path) as opened:
        s = trace_summary(opened)
    emit(s, format, _render)


def _render(s: dict) -> None:
    from rich.markup import escape

    console = make_console()
    d, b = s["dims"], s["buffers"]
    lines = [
        f"trace {s['path']} ({s['file_bytes'] / 2**20:.2f} MiB, {s['tensors']} tensors), {s['format']} v{s['version']}",
        f"shape: H={d['H']} K={d['K']} V={d['V']} T={d['T']}; {s['dtypes']['activation']} activations, "
        f"{s['dtypes']['state']} state; lower_bound {s['lower_bound']}; null id {s['null_id']}",
        f"buffers: {b['num_slots']} state slots, {b['num_record_rows']} record rows, {b['plan_rows']} plan rows; "
        f"final buffers {'recorded' if s['final_buffers'] else 'not recorded'}",
        f"layers: {s['layers']}{', sharing one plan' if s['layers'] > 1 else ''}; " + (
            "no conv state" if s["conv"] is None else
            f"conv state of width {s['conv']['width']} over {s['conv']['dim']} channels, {s['conv']['layout']}"),
        "events: " + (f"{s['events']}: " + ", ".join(
            f"{op} {n} ({s['events_with_expected'].get(op, 0)} with expected results)"
            for op, n in s["events_per_op"].items()) if s["events"] else "none"),
    ]
    if s["events_from_graph_replays"]:
        lines.append(f"events from CUDA graph replays: {s['events_from_graph_replays']}")
    for key, value in s["provenance"].items():
        lines.append(f"{key}: {human_value(value)}")
    for line in lines:
        console.print(escape(printable(line)))
