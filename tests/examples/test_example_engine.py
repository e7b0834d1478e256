"""The example serving engine (``examples/serve_engine.py``) over its RecoverSSM module
(``examples/recoverssm_module.py``): it runs the same for the same seed; ``kda record run
--patch examples.recoverssm_module`` records it unedited, in each mode and on a layer other
than 0, and the recording replays through kda's kernels and through the module bit for bit,
and through the reference; with the module's commit bug on, the recording fails and ``kda
repro`` shrinks it to a bundle that fails at the commit the bug made. With ``--commit context``
the engine keeps conv state, runs its conv update and commits every layer at once through the
module's own context, the same for the same seed, and captured in CUDA graphs as it runs eagerly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from examples.serve_engine import LOWER_BOUND
from traces.format.io import read_trace

REPO = Path(__file__).resolve().parents[2]
ENGINE = str(REPO / "examples" / "serve_engine.py")
MODULE = "examples.recoverssm_module"
MODULE_FILE = "examples/recoverssm_module.py"
BUG = "KDA_EXAMPLE_BUG"
EXACT = ["--atol", "0", "--rtol", "0"]
"""Every float dtype: the same kernels on the same device give the same bits."""
STEPS = 6
RECORDINGS = {
    "deferred": (["--mode", "deferred", "--layers", "1", "--steps", str(STEPS), "--seed", "1"], 0),
    "stock": (["--mode", "stock", "--layers", "1", "--steps", str(STEPS), "--seed", "2"], 0),
    "mixed": (["--mode", "mixed", "--layers", "2", "--steps", str(STEPS), "--seed", "4"], 1),
}
"""Name -> the engine's arguments and the layer recorded."""


def _run(command: list[str], **env: str) -> subprocess.CompletedProcess:
    """``command`` from the repository root, the repository on PYTHONPATH, no engine bug
    unless ``env`` sets one."""
    base = {name: value for name, value in os.environ.items() if name != BUG}
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**base, "PYTHONPATH": str(REPO), "NO_COLOR": "1", **env})


def _kda(*args: str, **env: str) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-m", "kda_cli", *args], **env)


def _record(path: Path, engine_args: list[str], layer: int, **env: str) -> subprocess.CompletedProcess:
    """Record the engine unedited; with ``--format json`` its own output goes to stderr."""
    return _kda("record", "run", str(path), "--patch", MODULE, "--layer", str(layer), "--format", "json", "--",
                sys.executable, ENGINE, *engine_args, **env)


def _replay(path: Path, impl: str, *tolerances: str) -> dict:
    done = _kda("replay", str(path), "--impl", impl, "--format", "json", "--no-progress", *tolerances)
    assert done.returncode in (0, 1), done.stderr
    return {"exit": done.returncode, **json.loads(done.stdout)}


def _step_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(("step ", "final "))]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """Each recording's trace and the engine's output while it was recorded."""
    folder = tmp_path_factory.mktemp("engine")
    runs = {}
    for name, (args, layer) in RECORDINGS.items():
        path = folder / f"{name}.safetensors"
        done = _record(path, args, layer)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["events"] > 0
        runs[name] = (path, done.stderr)
    return runs


def test_the_engine_gives_the_same_checksums_for_the_same_seed(recorded):
    """A plain run of the first steps prints what the recorded run of the same seed printed
    for them; the pools change over the run, and each layer has its own."""
    args, _ = RECORDINGS["mixed"]
    done = _run([sys.executable, ENGINE, *args, "--steps", "3"])
    assert done.returncode == 0, done.stderr
    lines, recorded_lines = _step_lines(done.stdout), _step_lines(recorded["mixed"][1])
    assert len(lines) == 3 + 1 and len(recorded_lines) == STEPS + 1
    assert lines[:3] == recorded_lines[:3]
    checksums = [line.split("pools ")[1].split() for line in recorded_lines]
    assert checksums[0] != checksums[-1] and all(len(c) == 2 and c[0] != c[1] for c in checksums)


def test_the_recordings_hold_what_a_serving_engine_does(recorded):
    """Slots reused by another request, padding rows, null slots, eager rows, and in mixed mode
    both kinds of step; the recorded layer is the one asked for."""
    for name, (path, _) in recorded.items():
        with read_trace(path) as trace:
            events = [(e.op, {role: trace.tensor(ref) for role, ref in e.inputs.items() if ref is not None})
                      for e in trace.events]
            provenance = trace.manifest.provenance
        assert provenance["layer"] == RECORDINGS[name][1] and provenance["patched"] == [MODULE]
        ops = [op for op, _ in events]
        assert ("defer" in ops) == (name != "stock")
        steps = [i for i, op in enumerate(ops) if op == "verify"]
        assert len(steps) == STEPS
        deferred_steps = sum(ops[i + 2] == "defer" for i in steps)
        assert deferred_steps == {"deferred": STEPS, "stock": 0}.get(name, deferred_steps)
        if name == "mixed":
            assert 0 < deferred_steps < STEPS
        owner: dict[int, int] = {}
        reused = False
        for op, inputs in events:
            if op != "verify":
                continue
            slots, rows = inputs["state_indices"].tolist(), inputs["record_indices"].tolist()
            for slot, row in zip(slots, rows):
                if slot > 0:
                    reused |= owner.setdefault(slot, row) != row
                    owner[slot] = row
        assert reused
        for padding_or_null in (-1, 0):
            assert any(padding_or_null in inputs["state_indices"].tolist() for op, inputs in events if op == "verify")
        if name != "stock":
            assert any(bool(inputs["eager"].any()) for op, inputs in events if op == "defer")


@pytest.mark.parametrize("name, impl", [
    ("deferred", "triton"), ("stock", "triton"), ("mixed", "triton"),
    ("mixed", "reference"), ("mixed", MODULE_FILE),
])
def test_a_recording_replays(recorded, name, impl):
    """Exit 0; through kda's kernels or the module (the same kernels, on the device that
    recorded), bit for bit."""
    path, _ = recorded[name]
    report = _replay(path, impl, *(EXACT if impl != "reference" else ()))
    assert report["exit"] == 0 and report["passed"], [t for e in report["events"] for t in e["tensors"]
                                                      if not t["passed"]][:3]


def test_the_commit_bug_fails_the_replay_and_repro_shrinks_it_to_the_commit(recorded, tmp_path):
    """With ``KDA_EXAMPLE_BUG=commit-len`` the engine's pools part from the correct run's once
    a reused slot is committed; the recording replays with exit 1, and ``kda repro`` writes a
    bundle whose first divergence is a commit's (or flush's) state, and whose ``repro.sh``
    exits 1."""
    args, layer = RECORDINGS["deferred"]
    path = tmp_path / "bug.safetensors"
    done = _record(path, args, layer, **{BUG: "commit-len"})
    assert done.returncode == 0, done.stderr
    correct, buggy = _step_lines(recorded["deferred"][1]), _step_lines(done.stderr)
    assert correct[0] == buggy[0] and correct[-1] != buggy[-1]

    report = _replay(path, "triton", "--stop-at-first")
    assert report["exit"] == 1 and not report["passed"]

    bundle = tmp_path / "bundle"
    done = _kda("repro", str(path), "--out", str(bundle), "--impl", "triton", "--format", "json")
    assert done.returncode == 1, done.stderr
    summary = json.loads(done.stdout)
    for found in (summary["original"], summary["shrunk"]):
        assert found["op"] in ("commit", "flush") and found["tensor"] == "states", found
    assert f"op `{summary['shrunk']['op']}`, tensor `states`" in (bundle / "report.md").read_text()
    done = subprocess.run(["sh", str(bundle / "repro.sh")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr


CONTEXT_RECORDING = ["--commit", "context", "--layers", "3", "--steps", "5", "--seed", "3",
                     "--conv-layout", "token_first"]


@pytest.fixture(scope="module")
def context_recorded(tmp_path_factory) -> Path:
    """The engine in context mode (3 layers, conv state, one commit a step through the module's
    own context) recorded unedited with ``--layers all``."""
    path = tmp_path_factory.mktemp("context") / "context.safetensors"
    done = _kda("record", "run", str(path), "--patch", MODULE, "--layers", "all", "--format", "json", "--",
                sys.executable, ENGINE, *CONTEXT_RECORDING)
    assert done.returncode == 0, done.stderr
    return path


def test_a_context_recording_holds_every_layer_its_conv_writes_and_one_commit_a_step(context_recorded):
    """A v2 trace of the 3 layers with their conv state: each step a conv write and a verify on
    every layer, then one ``commit_layers`` with rows read through ``request_indices``."""
    with read_trace(context_recorded) as trace:
        manifest = trace.manifest
        ops = [(e.op, e.attrs.get("layer", 0)) for e in trace.events]
        commits = [{role: trace.tensor(ref) for role, ref in e.inputs.items() if ref is not None}
                   for e in trace.events if e.op == "commit_layers"]
        conv_writes = [e for e in trace.events if e.op == "write" and e.inputs.get("conv_slots") is not None]
    assert manifest.num_layers == 3 and manifest.conv.layout == "token_first"
    assert [op for op, _ in ops].count("commit_layers") == 5
    assert sorted({layer for op, layer in ops if op == "verify"}) == [0, 1, 2]
    assert len(conv_writes) >= 5 and {e.attrs.get("layer", 0) for e in conv_writes} == {0, 1, 2}
    rows = [c["request_indices"].tolist() for c in commits if c.get("request_indices") is not None]
    assert rows and any(r != sorted(r) for r in rows)


@pytest.mark.parametrize("impl", ["triton", "reference", MODULE_FILE])
def test_a_context_recording_replays(context_recorded, impl):
    """Exit 0 through kda's context and kernels and through the module's own context (bit for
    bit: same kernels, conv a copy), and through the float64 reference at its tolerances."""
    report = _replay(context_recorded, impl, *(EXACT if impl != "reference" else ()))
    assert report["exit"] == 0 and report["passed"], [t for e in report["events"] for t in e["tensors"]
                                                      if not t["passed"]][:3]
    assert any(e["op"] == "commit_layers" for e in report["events"])


def test_a_wrong_conv_window_in_the_module_is_reported_at_its_layer_slot_and_position(context_recorded):
    """With ``KDA_EXAMPLE_BUG=conv-window`` the module's context takes layer 1's window one
    entry early on rows that accept every token: the replay through it fails (exit 1) at a
    ``commit_layers`` event's conv windows, layer 1, on a slot whose row accepted T tokens."""
    done = _kda("replay", str(context_recorded), "--impl", MODULE_FILE, "--format", "json", "--no-progress",
                *EXACT, **{BUG: "conv-window"})
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    failing = [t for e in report["events"] for t in e["tensors"] if not t["passed"]]
    assert failing and {t["role"] for t in failing} == {"conv_windows"}
    with read_trace(context_recorded) as trace:
        T = trace.manifest.dims.T
        for t in failing:
            for bad in (t["first_bad"], t["worst_bad"]):
                assert bad["op"] == "commit_layers" and bad["layer"] == 1
                assert {"slot", "channel", "position"} <= set(bad)
                event = trace.events[bad["event"]]
                x = {role: trace.tensor(ref) for role, ref in event.inputs.items() if ref is not None}
                row = x["state_indices"].tolist().index(bad["slot"])
                request = x["request_indices"][row] if "request_indices" in x else row
                assert int(x["num_accepted"][request]) == T


@pytest.mark.parametrize("args, env, message", [
    (["--graphs"], {}, "Error: --graphs needs a CUDA device"),
    (["--steps", "0"], {}, "Error: --steps 0: expected a positive number"),
    ([], {BUG: "commit-lens"}, f"Error: {BUG}=commit-lens: expected one of commit-len"),
    (["--commit", "context", "--mode", "deferred"], {}, "Error: --mode deferred: --commit context runs stock steps"),
    (["--conv-layout", "token_first"], {}, "Error: --conv-layout: applies only with --commit context"),
    (["--commit", "context", "--conv-width", "1"], {}, "Error: --conv-width 1: expected at least 2"),
], ids=["graphs-on-a-cpu", "no-steps", "unknown-bug", "context-deferred", "conv-without-context", "conv-width-1"])
def test_the_engine_refuses_bad_input_with_one_line(args, env, message, capsys):
    """Exit 2, one ``Error:`` line on stderr, nothing on stdout; an unknown bug (read when the
    module is imported) in a process of its own, the rest through ``main``."""
    if args == ["--graphs"] and torch.cuda.is_available():
        pytest.skip("--graphs runs on a CUDA device")
    if env:
        done = _run([sys.executable, ENGINE, *args], **env)
        code, out, err = done.returncode, done.stdout, done.stderr
    else:
        from examples.serve_engine import main

        try:
            code = main(args)
        except SystemExit as exc:
            code = exc.code
        out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [err.strip()] and err.startswith(message)


def test_the_stale_slot_commit_folds_one_record_more_on_a_slot_reused_by_another_row(device):
    """``StaleSlotCommit`` against kda's commit, bit for bit: a slot's first commit and a commit
    for the row it remembers fold ``n``; one for another row folds ``min(n + 1, T)``, once."""
    import kernels
    from examples.recoverssm_module import StaleSlotCommit
    from tests.support.seeds import fresh_seed

    H, K, V, T = 2, 16, 16, 4
    g = torch.Generator().manual_seed(fresh_seed())
    pool = (torch.randn(3, H, V, K, generator=g) * 0.5).to(device)
    records = kernels.allocate_records(3, H, T, K, V, torch.bfloat16, device)
    records.correction.copy_(torch.randn(records.correction.shape, generator=g))
    records.key_gate.copy_(torch.randn(records.key_gate.shape, generator=g))
    A_log = torch.log(torch.empty(H).uniform_(1.0, 16.0, generator=g)).to(device)
    dt_bias = torch.randn(H * K, generator=g).to(device)
    commit, expected = StaleSlotCommit(), pool.clone()

    def i32(*values: int) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    for slot, row, n, folds in ((1, 0, 2, 2), (1, 0, 2, 2), (1, 1, 2, 3), (1, 1, 2, 2), (2, 2, 1, 1), (2, 0, T, T),
                                (2, 1, 0, 0), (2, 0, 1, 1)):
        plan = kernels.CommitPlan(i32(n), i32(slot), i32(0), i32(0))
        commit(pool, records, A_log, dt_bias, LOWER_BOUND, i32(slot), plan, record_indices=i32(row))
        kernels.kda_recoverssm_commit(expected, records, A_log, dt_bias, LOWER_BOUND, i32(slot),
                                      kernels.CommitPlan(i32(folds), i32(slot), i32(0), i32(0)),
                                      record_indices=i32(row))
        assert torch.equal(pool, expected), f"slot {slot}, record row {row}, n={n}: expected {folds} folded"
        assert plan.commit_lens.tolist() == [n]


CONTEXT_ARGS = ["--commit", "context", "--layers", "2", "--steps", "4"]


def test_the_context_engine_gives_the_same_pools_and_conv_states_for_the_same_seed(capsys):
    """Each layer's line holds its state pool's checksum and its conv pool's; both change over
    the run, each layer has its own, the same seed prints the same, another seed not."""
    from examples.serve_engine import main

    lines = []
    for extra in (["--seed", "3"], ["--seed", "3"], ["--seed", "4"], ["--seed", "3", "--conv-layout", "token_first"]):
        assert main([*CONTEXT_ARGS, *extra]) == 0
        lines.append(_step_lines(capsys.readouterr().out))
    assert len(lines[0]) == 4 + 1 and lines[0] == lines[1] and lines[0] != lines[2]
    assert lines[3] == lines[0]  # the layout changes where entries live, not what they hold
    pairs = [[layer.split("/") for layer in line.split("pools ")[1].split()] for line in lines[0]]
    assert all(len(p) == 2 and p[0] != p[1] for p in pairs)
    assert pairs[0][0][0] != pairs[-1][0][0] and pairs[0][0][1] != pairs[-1][0][1]


def _context_engine(seed: int, conv_dim_first: bool = True, graphs: bool = False):
    from examples import recoverssm_module as mod
    from examples.serve_engine import PRESETS, Conv, Engine

    return Engine(mod, PRESETS["tiny"], 2, seed, "cuda" if torch.cuda.is_available() else "cpu", graphs,
                  Conv(4, conv_dim_first))


@pytest.mark.gpu
def test_the_context_engine_commits_every_layer_once_a_step_as_a_server_does(monkeypatch, capsys):
    """One commit a step through the module's context, of every layer: rows in another order
    than their requests (read through ``request_indices``), padding rows, null slots, slots
    reused by another request; verify writes records at the slots."""
    engine = _context_engine(seed=5)
    commits, verifies = [], []
    commit = engine.context.commit

    def recorded_commit(num_accepted, slots, qsl, request_indices=None, **align):
        commits.append((slots.tolist(), request_indices.tolist(), num_accepted.tolist()))
        commit(num_accepted, slots, qsl, request_indices=request_indices, **align)

    verify = engine.mod.kda_recoverssm_verify

    def recorded_verify(*args, record_indices=None, **kwargs):
        verifies.append((args[11].tolist(), record_indices.tolist()))
        return verify(*args, record_indices=record_indices, **kwargs)

    monkeypatch.setattr(engine.context, "commit", recorded_commit)
    monkeypatch.setattr(engine.mod, "kda_recoverssm_verify", recorded_verify)
    engine.run(8, "stock")
    capsys.readouterr()
    assert len(commits) == 8 and len(verifies) == 8 * 2
    assert all(slots == rows for slots, rows in verifies)
    owner, reused = {}, False
    for slots, requests, accepted in commits:
        assert sorted(requests) == list(range(len(slots)))
        for slot, request in zip(slots, requests):
            if slot > 0:
                reused |= owner.setdefault(slot, request) != request
                owner[slot] = request
    assert reused
    assert any(requests != sorted(requests) for slots, requests, _ in commits if sum(s > 0 for s in slots) > 1)
    assert any(-1 in slots for slots, _, _ in commits) and any(0 in slots for slots, _, _ in commits)


@pytest.mark.gpu
def test_the_conv_update_shifts_each_window_and_appends_its_inputs(device):
    """A full window, a partial one, a null slot with tokens and a padding row: a real slot's
    entries become history entries 1..W-2 then its new inputs, entries past them keep theirs;
    every other slot keeps its bits."""
    from examples.serve_engine import update_conv

    engine = _context_engine(seed=2, conv_dim_first=False)
    layer, batch, T = engine.layers[0], engine.batch, engine.shape.T
    g = torch.Generator().manual_seed(7)
    layer.conv_state.copy_(torch.randn(layer.conv_state.shape, generator=g).to(layer.conv_state))
    layer.conv_in.copy_(torch.randn(layer.conv_in.shape, generator=g).to(layer.conv_in))
    lens = [T, 2, T, T]
    batch.fill([3, 5, 0, -1], [3, 5, 0, -1], lens, [0] * 4, [False] * 4, [False] * 4, [0, 1, 2, 3])
    before = layer.conv_by_token.clone()
    update_conv(layer, batch)
    after, W = layer.conv_by_token, 4
    starts = [0, T, T + 2]
    for slot, m, start in ((3, T, starts[0]), (5, 2, starts[1])):
        expected = before[slot].clone()
        expected[:W - 2] = before[slot, 1:W - 1]
        expected[W - 2:W - 2 + m] = layer.conv_in[start:start + m]
        assert torch.equal(after[slot], expected), f"slot {slot}"
    untouched = [s for s in range(after.shape[0]) if s not in (3, 5)]
    assert torch.equal(after[untouched].view(torch.int16), before[untouched].view(torch.int16))


@pytest.mark.gpu
@pytest.mark.gpu_only
def test_the_context_engine_captured_in_cuda_graphs_runs_as_it_does_eagerly(capsys):
    """The whole step, the commit included, replayed from one CUDA graph prints what the same
    draws print run eagerly."""
    outputs = []
    for capture in (True, False):
        engine = _context_engine(seed=6, graphs=True)
        if capture:
            engine.capture([False])
        engine.run(6, "stock")
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and "step 5" in outputs[0]
