"""Helpers for the trace tests: a small synthetic trace, raw rewriting, and running the CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from traces.format.schema import METADATA_KEY
from traces.synth.simulation import SynthConfig, synthesize

TINY = SynthConfig(preset="tiny", mode="mixed", requests=5, seed=3, max_batch=4, max_decode_steps=3)


def make_trace(path: Path, config: SynthConfig = TINY) -> Path:
    synthesize(config).write(path)
    return path


INT32_MAX = 2**31 - 1


def record_align_trace(path: Path) -> Path:
    """A recorded align-mode decode loop (plan events with a block table), through the reference."""
    from tests.support.decode_loop import decode_loop
    from traces.record.recorder import record_trace

    with record_trace(path, "reference") as api:
        decode_loop(api, "align", steps=2)
    return path


def load_raw(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """Manifest as a dict and every tensor, bypassing validation."""
    with safe_open(str(path), "pt") as f:
        manifest = json.loads(f.metadata()[METADATA_KEY])
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    return manifest, tensors


def rewrite(src: Path, dst: Path, edit: Callable[[dict, dict[str, torch.Tensor]], None]) -> Path:
    """Copy ``src`` to ``dst`` with ``edit(manifest, tensors)`` applied, without validation."""
    manifest, tensors = load_raw(src)
    edit(manifest, tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dst), metadata={METADATA_KEY: json.dumps(manifest)})
    return dst


def first_event(manifest: dict, op: str, role: str | None = None) -> int:
    """Index of the first ``op`` event (that has expected ``role``, when given)."""
    for i, e in enumerate(manifest["events"]):
        if e["op"] == op and (role is None or role in e["expected"]):
            return i
    raise LookupError(op)


def run_kda(args: list[str], capsys, monkeypatch) -> tuple[int, str, str]:
    """Run ``kda ARGS`` in this process; return (exit code, stdout, stderr)."""
    from kda_cli.app import main

    monkeypatch.setattr(sys, "argv", ["kda", *args])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err
