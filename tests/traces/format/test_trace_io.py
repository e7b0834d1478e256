"""Trace format v1: write/read round trip, atomic writes, and the manifest schema."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.support.trace_helpers import TINY, load_raw, make_trace
from traces.format.io import TraceBuilder, read_trace, write_trace
from traces.format.schema import BUFFERS, FORMAT_NAME, Manifest, TraceError
from traces.synth.simulation import SynthConfig, synthesize


@pytest.fixture(scope="module")
def built():
    return synthesize(TINY)


def test_round_trip_keeps_manifest_and_every_tensor(built, tmp_path):
    path = tmp_path / "t.safetensors"
    built.write(path)
    with read_trace(path) as trace:
        assert trace.manifest.to_json() == built.manifest.to_json()
        assert trace.names == frozenset(built.tensors)
        for name, t in built.tensors.items():
            got = trace.tensor(name)
            assert got.dtype == t.dtype and got.shape == t.shape
            assert torch.equal(got.view(torch.uint8) if got.numel() else got,
                               t.contiguous().view(torch.uint8) if t.numel() else t), name


def test_manifest_has_the_documented_fields(built, tmp_path):
    path = make_trace(tmp_path / "t.safetensors")
    manifest, tensors = load_raw(path)
    assert manifest["format"] == FORMAT_NAME and manifest["version"] == 1  # one layer, no conv state
    assert manifest["dims"] == {"H": 2, "K": 16, "V": 16, "T": 4}
    assert manifest["dtypes"] == {"activation": "bfloat16", "state": "float32"}
    assert manifest["lower_bound"] == -5.0 and manifest["null_id"] == 0
    assert set(manifest["buffers"]) == {"num_slots", "num_record_rows", "plan_rows"}
    assert set(manifest["initial"]) == set(manifest["final"]) == set(BUFFERS)
    assert {"producer", "versions", "gpu", "note"} <= set(manifest["provenance"])
    ops = {e["op"] for e in manifest["events"]}
    assert ops == {"verify", "plan", "defer", "commit", "flush", "write"}
    for e in manifest["events"]:
        for name in [*e["inputs"].values(), *e["expected"].values()]:
            assert name in tensors
    assert tensors[manifest["initial"]["checkpoint_state"]].shape == (6, 2, 16, 16)


def test_events_are_a_consistent_story(built):
    """Every verify is followed by a plan; deferral only in deferred steps; flushes keep the
    counts they fold, as the documented flush plan kernel does, and a flushed request is not
    flushed again before its next deferral."""
    ops = [e.op for e in built.manifest.events]
    for i, op in enumerate(ops):
        if op == "verify":
            assert ops[i + 1] == "plan"
        if op == "defer":
            assert ops[i - 1] == "plan" and ops[i + 1] == "commit"
    flushes = [i for i, e in enumerate(built.manifest.events) if e.op == "flush"]
    assert flushes and all(built.manifest.events[i].attrs == {"consume_pending": False} for i in flushes)
    flushed_since_defer: set[int] = set()
    for e in built.manifest.events:
        if e.op in ("defer", "flush"):
            rows = built.tensors[e.inputs["record_rows"]]
            slots = built.tensors[e.inputs["state_indices"]]
            live = {int(r) for r, s in zip(rows, slots) if r >= 0 and s > 0}
            if e.op == "defer":
                flushed_since_defer -= live
            else:
                assert not live & flushed_since_defer, "a window folded twice"
                flushed_since_defer |= live


def test_write_is_atomic_and_leaves_no_temporary_file(built, tmp_path):
    path = tmp_path / "t.safetensors"
    path.write_bytes(b"old contents")
    bad = dict(built.tensors)
    bad[built.manifest.params["A_log"]] = torch.zeros(3)  # wrong shape: refused before writing
    with pytest.raises(TraceError, match="A_log"):
        write_trace(path, built.manifest, bad)
    assert path.read_bytes() == b"old contents"
    built.write(path)
    assert read_trace(path).manifest.events
    assert [p.name for p in tmp_path.iterdir()] == ["t.safetensors"]


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002])
def test_written_trace_gets_the_normal_file_mode(built, tmp_path, mask):
    """0666 & ~umask, as for any new file; not the 0600 of a temporary file."""
    path = tmp_path / "t.safetensors"
    old = os.umask(mask)
    try:
        built.write(path)
        first = stat.S_IMODE(path.stat().st_mode)
        built.write(path)  # written again over the first
        again = stat.S_IMODE(path.stat().st_mode)
    finally:
        os.umask(old)
    assert first == again == 0o666 & ~mask


def test_writer_refuses_unnamed_tensors(built, tmp_path):
    extra = {**built.tensors, "stray": torch.zeros(1)}
    with pytest.raises(TraceError, match="stray"):
        write_trace(tmp_path / "t.safetensors", built.manifest, extra)


def test_builder_names_tensors_by_event_and_role(tmp_path):
    b = synthesize(SynthConfig(preset="tiny", mode="stock", requests=1, steps=1, seed=0))
    assert [e.op for e in b.manifest.events] == ["verify", "plan", "commit"]
    verify = b.manifest.events[0]
    assert verify.inputs["q"] == "events.00000.in.q"
    assert verify.expected["out"] == "events.00000.expected.out"
    assert "record_indices" not in verify.inputs  # stock mode: record row = batch row
    assert b.manifest.initial["checkpoint_state"] == "initial.checkpoint_state"


def test_keep_expected_outputs_drops_only_states():
    b = synthesize(SynthConfig(preset="tiny", mode="mixed", requests=3, seed=1, keep_expected="outputs"))
    for e in b.manifest.events:
        assert "states" not in e.expected and "slots" not in e.expected
        if e.op == "verify":
            assert set(e.expected) == {"out", "records.correction", "records.key_gate"}
    none = synthesize(SynthConfig(preset="tiny", mode="stock", requests=2, seed=1, keep_expected="none"))
    assert all(not e.expected for e in none.manifest.events) and none.manifest.final


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.update(format="other"), "format is 'other'"),
    (lambda m: m.update(version=3), "version 3 is not supported"),
    (lambda m: m.update(version=2), "layers must be a non-empty list"),
    (lambda m: m["dims"].pop("K"), "dims.K"),
    (lambda m: m["events"][0].update(op="launch"), "event 0: op 'launch'"),
    (lambda m: m["events"][0]["inputs"].pop("q"), "event 0 (verify): inputs lack q"),
    (lambda m: m["events"][0]["inputs"].update(bogus="x"), "bogus is not a role of verify"),
])
def test_manifest_schema_errors_name_the_field(built, edit, message):
    data = json.loads(built.manifest.to_json())
    edit(data)
    with pytest.raises(TraceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Manifest.from_json(json.dumps(data))


def test_builder_api_for_recorders(tmp_path):
    """A recorder builds a trace event by event; the result reads back validated."""
    src = synthesize(SynthConfig(preset="tiny", mode="stock", requests=1, steps=1, seed=2))
    m = Manifest.from_json(src.manifest.to_json())
    m.params, m.initial, m.final, m.events = {}, {}, {}, []
    b = TraceBuilder(m)
    b.set_params(src.tensors["params.A_log"], src.tensors["params.dt_bias"])
    b.set_buffers("initial", {role: src.tensors[f"initial.{role}"] for role in BUFFERS})
    ev = src.manifest.events[1]  # the plan
    index = b.add_event("plan", {r: src.tensors[n] for r, n in ev.inputs.items()})
    assert index == 0
    b.write(tmp_path / "rec.safetensors")
    with read_trace(tmp_path / "rec.safetensors") as t:
        assert [e.op for e in t.events] == ["plan"] and not t.manifest.final


def test_a_stop_during_a_tensor_read_comes_after_the_read(tmp_path):
    """Ctrl-C while safetensors builds a tensor: the extension would turn the
    ``KeyboardInterrupt`` raised inside it into an error of its own (a stopped replay then
    read as a damaged file); held, the read completes and the stop follows it, through the
    command line's handler, which names the signal."""
    from kda_cli import runtime

    trace = read_trace(make_trace(tmp_path / "t.safetensors"))
    name = sorted(trace.names)[0]
    handle, reads = trace._handle, []

    class Extension:  # safetensors' handle, and what it makes of an exception raised inside it
        def get_tensor(self, tensor_name):
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)  # the handler runs here, inside the read
            except BaseException:
                raise TypeError("could not determine the shape of object type 'torch.storage.UntypedStorage'")
            reads.append(tensor_name)
            return handle.get_tensor(tensor_name)

    trace._handle = Extension()
    with runtime.stop_signals():
        with pytest.raises(KeyboardInterrupt):
            trace.tensor(name)
        assert reads == [name]
        assert runtime.interrupted().code == 128 + signal.SIGINT


@pytest.mark.parametrize("sent, setup, stdout, status", [
    ("SIGTERM", "pass", "finished\n", -signal.SIGTERM),  # the default action, once the block is done
    ("SIGTERM", "signal.signal(signal.SIGTERM, signal.SIG_IGN)", "finished\ngone on\n", 0),  # stays ignored
    ("SIGTERM", "signal.signal(signal.SIGTERM, lambda s, f: print('handled', s))",
     f"finished\nhandled {int(signal.SIGTERM)}\ngone on\n", 0),  # a handler that returns: the work goes on
    ("SIGINT", "pass", "finished\nstopped\ngone on\n", 0),  # Python's own handler: KeyboardInterrupt
])
def test_a_held_signal_is_taken_as_the_handler_before_would_take_it(sent, setup, stdout, status):
    """In a library, holding a stop signal changes when it is taken, not how."""
    script = f"""
import os, signal, time
from traces.format.signals import interrupts_held
{setup}
try:
    with interrupts_held():
        os.kill(os.getpid(), signal.{sent})
        time.sleep(0.05)
        print("finished", flush=True)
except KeyboardInterrupt:
    print("stopped", flush=True)
print("gone on", flush=True)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[3])
    assert (done.stdout, done.returncode) == (stdout, status), done.stderr
