"""Trace format v2: several layers, conv state and the engine's commit of every layer.

A synthesised 3-layer trace with conv state (each step a verify and a conv update a layer,
then one ``commit_layers`` through shuffled request indices) replays through kda's kernels
and the reference; a commit context whose conv compaction is one position off is caught at
the layer, slot, channel and position; hostile v2 manifests are refused with one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.support.trace_helpers import load_raw, make_trace, rewrite, run_kda
from traces.format.io import read_trace
from traces.synth.config import SynthConfig

BROKEN_CONV = str(Path(__file__).parents[2] / "broken_impls" / "conv_window_off_by_one.py")
LAYERS = SynthConfig(preset="tiny", mode="stock", requests=4, seed=5, max_batch=4, max_decode_steps=2, layers=3,
                     conv_width=3)


@pytest.fixture(scope="module")
def v2_trace(tmp_path_factory) -> Path:
    return make_trace(tmp_path_factory.mktemp("v2") / "layers.safetensors", LAYERS)


@pytest.fixture(scope="module")
def token_first_trace(tmp_path_factory) -> Path:
    config = SynthConfig(**{**vars(LAYERS), "layers": 2, "conv_layout": "token_first", "seed": 6})
    return make_trace(tmp_path_factory.mktemp("v2") / "token-first.safetensors", config)


def replay_json(args: list[str], capsys, monkeypatch) -> tuple[int, dict]:
    code, out, err = run_kda(["replay", *args, "--format", "json", "--no-progress"], capsys, monkeypatch)
    assert "Traceback" not in out + err
    return code, json.loads(out)


def bad_elements(report: dict, role: str) -> list[dict]:
    return [c[key] for e in report["events"] for c in e["tensors"] if c["role"] == role and not c["passed"]
            for key in ("first_bad", "worst_bad")]


def test_a_one_layer_trace_is_still_version_1_and_replays(tmp_path, capsys, monkeypatch):
    path = make_trace(tmp_path / "v1.safetensors", SynthConfig(preset="tiny", mode="stock", requests=2, seed=1,
                                                               max_batch=2, max_decode_steps=2))
    assert load_raw(path)[0]["version"] == 1
    code, report = replay_json([str(path)], capsys, monkeypatch)
    assert code == 0 and report["passed"]
    assert all("layer" not in c["first_bad"] for e in report["events"] for c in e["tensors"] if c["first_bad"])


def test_the_manifest_holds_every_layer_and_the_conv_state(v2_trace):
    manifest, _ = load_raw(v2_trace)
    assert manifest["version"] == 2 and len(manifest["layers"]) == 3
    assert manifest["conv"] == {"layout": "dim_first", "dim": 96, "width": 3}
    assert set(manifest["initial"]) == {"plan.commit_lens", "plan.final_state_indices",
                                        "plan.boundary_state_indices", "plan.boundary_recovery_lens"}
    assert all(set(layer["initial"]) == {"checkpoint_state", "records.correction", "records.key_gate", "pending",
                                         "conv_state"} for layer in manifest["layers"])
    ops = [(e["op"], e["attrs"].get("layer", 0)) for e in manifest["events"]]
    assert {("verify", 0), ("verify", 1), ("verify", 2), ("write", 2), ("commit_layers", 0)} <= set(ops)
    with read_trace(v2_trace) as trace:
        shapes = {role: trace.meta(name).shape for role, name in trace.manifest.layer(2).initial.items()}
        commit = next(e for e in trace.events if e.op == "commit_layers")
        windows = trace.meta(commit.expected["conv_windows"]).shape
    assert shapes["conv_state"] == (6, 96, 2 + 4 - 1) and shapes["records.correction"][0] == 6
    assert windows[0] == 3 and windows[2:] == (96, 2)


def test_info_prints_the_version_and_the_layers(v2_trace, capsys, monkeypatch):
    code, out, _ = run_kda(["info", str(v2_trace)], capsys, monkeypatch)
    assert code == 0
    assert "kda-trace v2" in out and "layers: 3, sharing one plan; conv state of width 3 over 96 channels" in out


@pytest.mark.parametrize("impl", ["triton", "reference"])
def test_three_layers_with_conv_state_replay(v2_trace, impl, capsys, monkeypatch):
    code, report = replay_json([str(v2_trace), "--impl", impl], capsys, monkeypatch)
    assert code == 0 and report["passed"]
    compared = {c["role"] for e in report["events"] if e["op"] == "commit_layers" for c in e["tensors"]}
    assert compared == {"states", "conv_windows"}
    final = [c["tensor"] for c in report["final"]]
    assert sum(name.endswith("final.conv_state") for name in final) == 3
    assert "kernels.context.reference" in report["routes"]["commit_layers"] if impl == "reference" else \
        "kernels.context.engine" in report["routes"]["commit_layers"]


def test_a_token_first_conv_state_replays(token_first_trace, capsys, monkeypatch):
    code, report = replay_json([str(token_first_trace)], capsys, monkeypatch)
    assert code == 0 and report["passed"]


def test_a_conv_window_one_position_off_is_named_by_layer_slot_and_position(v2_trace, capsys, monkeypatch):
    code, report = replay_json([str(v2_trace), "--impl", BROKEN_CONV, "--stop-at-first"], capsys, monkeypatch)
    assert code == 1 and not report["passed"]
    bad = bad_elements(report, "conv_windows")
    assert bad, report
    first = bad[0]
    assert {"layer", "slot", "channel", "position"} <= set(first) and first["op"] == "commit_layers"
    assert first["layer"] == 0 and first["slot"] >= 1 and 0 <= first["position"] < 2
    assert not bad_elements(report, "states")  # the state commit is kda's own


EXAMPLE_MODULE = str(Path(__file__).parents[3] / "examples" / "recoverssm_module.py")


def test_the_example_modules_own_context_replays(v2_trace, capsys, monkeypatch):
    """The example engine's module carries a commit context of its own: the trace's commits
    of every layer run through it and pass."""
    monkeypatch.delenv("KDA_EXAMPLE_BUG", raising=False)
    code, report = replay_json([str(v2_trace), "--impl", EXAMPLE_MODULE], capsys, monkeypatch)
    assert code == 0 and report["passed"]
    assert report["routes"]["commit_layers"].endswith("(KDARecoverSSMCommitContext)")


def test_the_example_modules_conv_window_bug_is_named_at_layer_1(v2_trace, capsys, monkeypatch):
    monkeypatch.setenv("KDA_EXAMPLE_BUG", "conv-window")
    code, report = replay_json([str(v2_trace), "--impl", EXAMPLE_MODULE, "--stop-at-first"], capsys, monkeypatch)
    assert code == 1 and not report["passed"]
    first = bad_elements(report, "conv_windows")[0]
    assert first["op"] == "commit_layers" and first["layer"] == 1 and first["slot"] >= 1
    assert 0 <= first["position"] < 2 and not bad_elements(report, "states")


def test_layers_option_compares_only_those_layers(v2_trace, capsys, monkeypatch):
    code, report = replay_json([str(v2_trace), "--impl", BROKEN_CONV, "--layers", "2"], capsys, monkeypatch)
    assert code == 1
    assert {b["layer"] for b in bad_elements(report, "conv_windows")} == {2}
    per_layer = [e for e in report["events"] if e["op"] == "verify"]
    assert per_layer and all(t["first_bad"] is None for e in per_layer for t in e["tensors"])
    assert len([c for c in report["final"] if c["role"] == "checkpoint_state"]) == 1
    code, _, err = run_kda(["replay", str(v2_trace), "--layers", "3", "--no-progress"], capsys, monkeypatch)
    assert code == 2 and err.startswith("Error: ") and "layer 3 is not in the trace" in err


def _commit_layers(m: dict) -> dict:
    return next(e for e in m["events"] if e["op"] == "commit_layers")


def _bad_layer(m, t):
    next(e for e in m["events"] if e["op"] == "verify")["attrs"]["layer"] = 3


def _bad_layout(m, t):
    m["conv"]["layout"] = "channels_last"


def _request_out_of_range(m, t):
    event = _commit_layers(m)
    requests = event["inputs"]["request_indices"]
    t[requests] = t[requests].clone()
    t[requests][0] = t[event["inputs"]["num_accepted"]].shape[0]


def _aliased_layers(m, t):
    t.pop(m["layers"][1]["initial"]["checkpoint_state"])
    m["layers"][1]["initial"]["checkpoint_state"] = m["layers"][0]["initial"]["checkpoint_state"]


def _conv_shape(m, t):
    name = m["layers"][1]["initial"]["conv_state"]
    t[name] = t[name].transpose(1, 2).contiguous()


def _commit_without_conv(m, t):
    del m["conv"]
    for layer in m["layers"]:
        for section in ("initial", "final"):
            t.pop(layer[section].pop("conv_state"))
    for e in m["events"]:
        for role in ("conv_slots", "conv_states", "conv_windows"):
            name = e["inputs"].pop(role, None) or e["expected"].pop(role, None)
            if name:
                t.pop(name)
    m["events"] = [e for e in m["events"] if e["inputs"]]


def _windows_without_slots(m, t):
    t.pop(_commit_layers(m)["expected"].pop("slots"))


def _width_one(m, t):
    m["conv"]["width"] = 1


def _one_layer_without_final(m, t):
    for name in m["layers"][2]["final"].values():
        t.pop(name)
    m["layers"][2]["final"] = {}


def _unknown_records(m, t):
    _commit_layers(m)["attrs"]["records"] = "request"


def _unknown_rule(m, t):
    _commit_layers(m)["attrs"]["rule"] = "vllm-0.34"


def _write_to_a_slot_twice(m, t):
    write = next(e for e in m["events"] if e["op"] == "write" and "conv_slots" in e["inputs"]
                 and t[e["inputs"]["conv_slots"]].numel() > 1)
    slots = write["inputs"]["conv_slots"]
    t[slots] = t[slots].clone()
    t[slots][1] = t[slots][0]


@pytest.mark.parametrize("edit,message", [
    (_bad_layer, "attrs.layer must be a layer index in [0, 2], got 3"),
    (_bad_layout, "conv.layout 'channels_last' is not one of dim_first, token_first"),
    (_request_out_of_range, "(request_indices): request index"),
    (_aliased_layers, "is named for two roles"),
    (_conv_shape, "layers[1].initial: tensor 'layers.1.initial.conv_state' (conv_state): shape [6, 5, 96]"),
    (_commit_without_conv, "commit_layers needs conv state; the trace has none"),
    (_windows_without_slots, "expected states, conv_windows without the slots they hold"),
    (_width_one, "conv.width must be at least 2"),
    (_one_layer_without_final, "final names the buffers of some layers or of the plan but not of all"),
    (_write_to_a_slot_twice, "appears more than once"),
    (_unknown_records, "attrs.records must be one of slot, batch_row, got 'request'"),
    (_unknown_rule, "attrs.rule must be one of kda, vllm-0.33.0, got 'vllm-0.34'"),
], ids=["layer-index", "conv-layout", "request-index", "aliasing", "conv-shape", "commit-without-conv",
        "windows-without-slots", "conv-width", "partial-final", "conv-slot-twice", "records", "rule"])
def test_hostile_v2_manifests_are_refused_with_one_line(v2_trace, tmp_path, capsys, monkeypatch, edit, message):
    bad = rewrite(v2_trace, tmp_path / "bad.safetensors", edit)
    code, out, err = run_kda(["replay", str(bad), "--no-progress"], capsys, monkeypatch)
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("Error: "), (code, err)
    assert message in err, err
    assert "Traceback" not in out + err


def test_synth_refuses_deferred_layers(tmp_path, capsys, monkeypatch):
    code, _, err = run_kda(["synth", str(tmp_path / "x.safetensors"), "--layers", "2", "--mode", "deferred"],
                           capsys, monkeypatch)
    assert code == 2 and not (tmp_path / "x.safetensors").exists()
    assert err.strip().splitlines() == ["Error: --mode deferred: traces of several layers or conv state are "
                                        "synthesised in stock mode only (--mode stock, which they get when --mode "
                                        "is not given)"]


@pytest.mark.parametrize("option", [["--layers", "2"], ["--conv-width", "3"]])
def test_synth_of_layers_or_conv_state_needs_no_mode(option, tmp_path, capsys, monkeypatch):
    """Stock is the one mode of a trace of the engine's commit: without --mode it is the one."""
    out = tmp_path / "x.safetensors"
    code, _, err = run_kda(["synth", str(out), *option, "--requests", "1", "--steps", "1"], capsys, monkeypatch)
    assert code == 0, err
    with read_trace(out) as trace:
        assert [e.op for e in trace.events if e.op != "write"] == ["verify"] * trace.manifest.num_layers + \
            ["commit_layers"]
        assert "--mode stock" in trace.manifest.provenance["note"]


def test_the_synthesised_commit_moves_each_window_to_its_accepted_token(v2_trace):
    """The expected conv windows are the source's entries n - 1 .. n + W - 3 (docs/design.md §10):
    checked here from the trace's own tensors, the last conv update before each commit."""
    with read_trace(v2_trace) as trace:
        events = trace.events
        checked = 0
        for i, event in enumerate(events):
            if event.op != "commit_layers" or "conv_windows" not in event.expected:
                continue
            x = trace.tensors(event.inputs)
            update = next(events[j] for j in range(i - 1, -1, -1)
                          if events[j].op == "write" and events[j].attrs.get("layer", 0) == 2)
            conv_slots = trace.tensor(update.inputs["conv_slots"]).tolist()
            conv = trace.tensor(update.inputs["conv_states"])
            windows = trace.tensor(event.expected["conv_windows"])[2]
            written = trace.tensor(event.expected["slots"]).tolist()
            for b, slot in enumerate(x["state_indices"].tolist()):
                if slot <= 0 or slot not in written:
                    continue
                n = int(x["num_accepted"][x["request_indices"][b]])
                qsl = x["query_start_loc"]
                n = min(n, int(qsl[b + 1] - qsl[b]))
                source = conv[conv_slots.index(slot)]
                assert torch.equal(windows[written.index(slot)], source[:, n - 1:n + 1])
                checked += 1
    assert checked


def test_every_per_layer_op_runs_on_the_layer_it_names(tmp_path, capsys, monkeypatch):
    """A mixed one-layer trace played twice, on layer 0 then on layer 1 (the same initial
    buffers): verify, plan, defer, commit, flush and write each run on the layer of their
    attr, so the second pass expects what the first did; a wrong expected state in the
    second pass is reported at layer 1."""
    from traces.format.io import TraceBuilder
    from traces.format.schema import LAYER_BUFFERS, Manifest
    from traces.format.tape import Tape

    with read_trace(make_trace(tmp_path / "v1.safetensors", SynthConfig(
            preset="tiny", mode="mixed", requests=4, seed=7, max_batch=4, max_decode_steps=3))) as trace:
        tape = Tape.load(trace)
    manifest = Manifest(tape.dims, tape.activation_dtype, tape.state_dtype, tape.lower_bound, tape.sizes(), {}, {})
    builder = TraceBuilder(manifest)
    for layer in (0, 1):
        builder.set_params(tape.params["A_log"], tape.params["dt_bias"], layer=layer)
        builder.set_buffers("initial", tape.initial, layer=layer)
        builder.set_buffers("final", tape.final, layer=layer)
    for layer in (0, 1):
        for step in tape.steps:
            builder.add_event(step.op, step.inputs, step.expected, {**step.attrs, "layer": layer})
    assert {e.op for e in manifest.events} == {"verify", "plan", "defer", "commit", "flush", "write"}
    assert set(manifest.layer(1).initial) == set(LAYER_BUFFERS) and manifest.version == 2
    path = tmp_path / "twice.safetensors"
    builder.write(path)
    code, report = replay_json([str(path), "--impl", "reference"], capsys, monkeypatch)
    assert code == 0 and report["passed"]

    second = next(i for i, e in enumerate(manifest.events) if e.attrs["layer"] == 1 and e.op == "commit"
                  and "states" in e.expected)

    def damage(m, t):
        name = m["events"][second]["expected"]["states"]
        t[name] = t[name] + 1.0

    code, report = replay_json([str(rewrite(path, tmp_path / "damaged.safetensors", damage)), "--impl", "reference"],
                               capsys, monkeypatch)
    bad = bad_elements(report, "states")
    assert code == 1 and bad and all(b["layer"] == 1 and b["event"] == second for b in bad)
