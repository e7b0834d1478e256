"""``kda slice`` and ``kda repro`` on traces of format v2 (several layers, conv state, the
engine's commit of every layer): a slice replays through kda's kernels and the reference;
a commit context wrong in one layer's conv window is shrunk to a bundle that fails the
same way (op, tensor, layer) in a fresh process; a passing trace writes no bundle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.trace_helpers import make_trace, run_kda
from traces.format.io import read_trace
from traces.synth.config import SynthConfig

LAYERS = SynthConfig(preset="tiny", mode="stock", requests=2, seed=5, max_batch=2, max_decode_steps=2, layers=3,
                     conv_width=3, steps=2)
"""Two decode steps: 14 events, a commit of every layer at events 6 and 13."""


@pytest.fixture(scope="module")
def v2_trace(tmp_path_factory) -> Path:
    return make_trace(tmp_path_factory.mktemp("v2") / "layers.safetensors", LAYERS)


@pytest.mark.parametrize("events", ["4:9", "4:14"])
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


def test_a_slice_folds_each_commit_through_the_reference_context_of_its_records(v2_trace, tmp_path, capsys,
                                                                               monkeypatch):
    """A trace whose commits keep records by batch row (expected results the reference's): the
    events before the slice run each commit through the reference context of those records,
    and the slice replays."""
    import kernels.reference
    from kernels.context.reference import ReferenceCommitContext
    from traces.format.tape import Tape
    from traces.replay.buffers import initial_layer_buffers
    from traces.replay.play import Player
    from traces.repro.expected import with_expected

    with read_trace(v2_trace) as trace:
        tape = Tape.load(trace)
    for step in tape.steps:
        if step.op == "commit_layers":
            step.attrs["records"] = "batch_row"
    by_row = tmp_path / "by-row.safetensors"
    with_expected(tape, kernels.reference, final=True).write(by_row)
    player = Player(tape, kernels.reference, initial_layer_buffers(tape, kernels.reference, "cpu"), "cpu")
    for step in tape.steps[:7]:
        player(step)
    (key, context), = player.commits.opened.items()
    assert key == ("batch_row", "kda") and type(context) is ReferenceCommitContext and context.records == "batch_row"

    out = tmp_path / "cut.safetensors"
    code, _, err = run_kda(["slice", str(by_row), "--events", "7:14", "--out", str(out)], capsys, monkeypatch)
    assert code == 0, err
    with read_trace(out) as cut:
        assert [e.attrs.get("records") for e in cut.events if e.op == "commit_layers"] == ["batch_row"]
    code, out_text, err = run_kda(["replay", str(out), "--no-progress"], capsys, monkeypatch)
    assert code == 0, out_text + err


BROKEN = Path(__file__).resolve().parents[2] / "broken_impls"


def test_a_conv_window_wrong_in_one_layer_is_shrunk_to_a_bundle_that_fails_there(v2_trace, tmp_path, capsys,
                                                                                 monkeypatch):
    """conv_window_one_layer.py corrupts layer 1's window after each commit: the bundle holds
    fewer events, layers and heads and fails at commit_layers / conv_windows in layer 1 again,
    also through ``sh repro.sh`` in a fresh process (the check ``kda repro`` runs before it
    writes the bundle)."""
    impl, bundle = str(BROKEN / "conv_window_one_layer.py"), tmp_path / "bundle"
    code, out, err = run_kda(["repro", str(v2_trace), "--out", str(bundle), "--impl", impl, "--format", "json"],
                             capsys, monkeypatch)
    assert code == 1, err
    summary = json.loads(out)
    for which in ("original", "shrunk"):
        found = summary[which]
        assert (found["op"], found["tensor"], found["kind"], found["layer"]) == (
            "commit_layers", "conv_windows", "mismatch", 1), summary
    assert summary["fresh_process_exit"] == 1
    assert summary["shrunk_events"] < summary["events"] and summary["shrunk_layers"] == 2
    assert summary["shrunk_dims"]["H"] == 1
    with read_trace(bundle / "trace.safetensors") as small:
        assert small.manifest.version == 2 and small.manifest.num_layers == 2
        assert small.events[-1].op == "commit_layers"
    assert "; 2 layers (format v2)" in (bundle / "report.md").read_text()
    # the bundle was replayed by `sh repro.sh --format json --no-progress` in a fresh process, layer compared
    assert ("exited 1 with first divergence commit_layers / conv_windows / mismatch / layer 1: the same signature"
            in (bundle / "report.md").read_text())


def test_repro_of_a_v2_trace_that_passes_writes_nothing_and_exits_0(v2_trace, tmp_path, capsys, monkeypatch):
    bundle = tmp_path / "bundle"
    code, out, err = run_kda(["repro", str(v2_trace), "--out", str(bundle), "--format", "json"], capsys, monkeypatch)
    assert code == 0, err
    assert json.loads(out)["passed"] and not bundle.exists()


def test_determinism_replays_every_layer_and_compares_each_result(v2_trace):
    """The reference's runs agree bit for bit; racy_verify.py's verifies (every layer's) do not."""
    import kernels.reference
    from traces.format.tape import Tape
    from traces.impl.loader import load_impl
    from traces.repro.determinism import check_determinism

    with read_trace(v2_trace) as trace:
        tape = Tape.load(trace)
    report = check_determinism(tape, kernels.reference, 2)
    assert report.deterministic and report.errors == [None, None], report.to_json()
    racy = check_determinism(tape, load_impl(str(BROKEN / "racy_verify.py")), 2)
    differing = {(d.event, d.op, d.tensor) for d in racy.differences}
    verifies = {i for i, s in enumerate(tape.steps) if s.op == "verify"}
    assert {(i, "verify", "out") for i in verifies} <= differing, racy.to_json()
