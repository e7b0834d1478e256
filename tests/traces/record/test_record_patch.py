"""Recording programs as they run: an unedited script through ``kda record run --patch`` (the
engine's raw kernels launched by the script itself, one layer of two chosen), and calls
inside a CUDA graph capture passed through untouched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.trace_helpers import run_kda
from traces.format.io import read_trace
from traces.record.capture import CAPTURED_NOTE
from traces.record.patch import BOOT_DIR
from traces.record.recorder import record_trace

REPO = Path(__file__).resolve().parents[3]
SCRIPT = str(REPO / "tests" / "support" / "engine_script.py")
PATCHES = ["--patch", "tests.support.documented_surface", "--patch", "kernels"]
STEP_OPS = {"deferred": ["flush", "verify", "plan", "defer", "commit"], "stock": ["flush", "verify", "plan", "commit"]}
SCRIPT_OPS = STEP_OPS["deferred"] * 2 + STEP_OPS["stock"] + ["flush"]
"""What ``engine_script.py 3`` runs on each layer: two deferred steps, a stock one, a flush."""


@pytest.fixture(scope="module")
def plain_output() -> str:
    """The script's output when nothing records it."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    done = subprocess.run([sys.executable, SCRIPT, "3"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _replays(path: Path, impl: str, capfd, monkeypatch) -> None:
    code, out, err = run_kda(["replay", str(path), "--impl", impl, "--no-progress", "--format", "json"], capfd,
                             monkeypatch)
    assert code == 0 and json.loads(out)["passed"], err


def test_record_run_patch_records_an_unedited_script(tmp_path, plain_output, capfd, monkeypatch):
    """JSON on stdout alone, the script's own output unchanged on stderr, the interpreter chosen
    for a machine without a GPU; the trace replays through kda and through the engine's module."""
    interpret = os.environ.get("TRITON_INTERPRET")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # kda record chooses it for the child
    path = tmp_path / "engine.safetensors"
    code, out, err = run_kda(["record", "run", str(path), *PATCHES, "--format", "json", "--",
                              sys.executable, SCRIPT, "3"], capfd, monkeypatch)
    assert code == 0, err
    summary = json.loads(out)
    assert summary["events"] == len(SCRIPT_OPS) and summary["interpreter"] is not torch.cuda.is_available()
    if interpret is not None:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)  # as the kernels of this process were imported
    assert plain_output in err
    with read_trace(path) as trace:
        assert [e.op for e in trace.events] == SCRIPT_OPS
        provenance = trace.manifest.provenance
    assert provenance["patched"] == ["tests.support.documented_surface", "kernels"]
    assert (provenance["layer"], provenance["layers_seen"]) == (0, 2)
    assert provenance["skipped_calls"]["other_layer"] > 0
    _replays(path, "triton", capfd, monkeypatch)
    _replays(path, "tests/support/documented_surface.py", capfd, monkeypatch)


def test_layer_picks_the_nth_set_of_buffers_and_the_env_variable_patches(tmp_path, plain_output, capfd, monkeypatch):
    """``--layer 1`` records the second layer (its parameters, not the first's); setting
    ``KDA_RECORD_PATCH`` with the start-up hook on PYTHONPATH records the same trace."""
    from tests.support.engine_script import layer_buffers

    g = torch.Generator().manual_seed(0)
    first, second = layer_buffers(g), layer_buffers(g)
    path = tmp_path / "layer1.safetensors"
    code, out, err = run_kda(["record", "run", str(path), *PATCHES, "--layer", "1", "--",
                              sys.executable, SCRIPT, "3"], capfd, monkeypatch)
    assert code == 0, err
    assert out.startswith(plain_output) and f"wrote {path}: {len(SCRIPT_OPS)} events" in out
    by_env = tmp_path / "env.safetensors"
    env = dict(os.environ, KDA_RECORD=str(by_env), KDA_RECORD_PATCH="tests.support.documented_surface,kernels",
               KDA_RECORD_LAYER="1", PYTHONPATH=os.pathsep.join([str(BOOT_DIR), str(REPO)]))
    done = subprocess.run([sys.executable, SCRIPT, "3"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout == plain_output, done.stderr
    for trace_path in (path, by_env):
        with read_trace(trace_path) as trace:
            assert [e.op for e in trace.events] == SCRIPT_OPS
            A_log = trace.tensor(trace.manifest.params["A_log"])
            assert trace.manifest.provenance["layer"] == 1
        assert torch.equal(A_log.cpu(), second["A_log"].cpu()) and not torch.equal(A_log.cpu(), first["A_log"].cpu())
    _replays(path, "triton", capfd, monkeypatch)


def test_layers_all_records_every_layer_with_its_own_buffers(tmp_path, plain_output, capfd, monkeypatch):
    """``--layers all``: both layers of the script in one v2 trace, each layer's flushes (the
    raw flush plan kernel), verifies, plans, defers (the raw kernel) and commits on its own
    buffers; the script runs as unrecorded, and the trace replays bit for bit."""
    from tests.support.engine_script import layer_buffers

    path = tmp_path / "layers.safetensors"
    code, out, err = run_kda(["record", "run", str(path), *PATCHES, "--layers", "all", "--", sys.executable, SCRIPT,
                              "3"], capfd, monkeypatch)
    assert code == 0 and out.startswith(plain_output), err
    g = torch.Generator().manual_seed(0)
    model = [layer_buffers(g) for _ in range(2)]
    with read_trace(path) as trace:
        m = trace.manifest
        per_layer = [[e.op for e in trace.events if e.op != "write" and e.attrs.get("layer", 0) == i] for i in (0, 1)]
        A_log = [trace.tensor(m.layer(i).params["A_log"]) for i in (0, 1)]
    assert (m.version, m.num_layers, m.provenance["layers"], m.provenance["skipped_calls"]) == (2, 2, "all", {})
    assert per_layer == [SCRIPT_OPS, SCRIPT_OPS]
    assert all(torch.equal(A_log[i], model[i]["A_log"].cpu()) for i in (0, 1))
    code, out, err = run_kda(["replay", str(path), "--no-progress", "--atol", "0", "--rtol", "0"], capfd, monkeypatch)
    assert code == 0, out + err


@pytest.mark.parametrize("args, message", [
    (["--layer", "-1", *PATCHES], "--layer -1: expected a layer number >= 0"),
    (["--layer", "1"], "--layer needs --patch"),
    (["--snapshot", "some", *PATCHES], "snapshot 'some': expected one of touched, all"),
    (["--ops", "verify,fold"], "ops: fold not among verify, plan, defer, commit, flush"),
    (["--ops", ""], "--ops '': name at least one op"),  # would have recorded every op
    (["--max-events", "0"], "--max-events 0: must be a positive number"),
    (["--max-mb", "-1", *PATCHES], "--max-mb -1: must be a positive number"),
    (["--max-mb", "nan"], "--max-mb nan: must be a positive number"),
    (["--max-mb", "inf"], "--max-mb inf: must be a positive number"),
    (["--max-mb", "1e-9"], "--max-mb 1e-09: less than one byte"),
    (["--impl", "missing/engine.py"], "--impl missing/engine.py: no such file"),
    (["--patch", "tests.nosuch_surface"], "--patch tests.nosuch_surface: no such module on the import path"),
    (["--patch", "examples.recoverssm_module,nosuch_top_level"], "--patch nosuch_top_level: no such module"),
])
def test_bad_record_run_options_are_refused_before_the_command_runs(tmp_path, args, message, capfd, monkeypatch):
    """What the child's recorder would refuse once the program has started (with ``--patch``
    it would then run unrecorded) is one error line, exit 2, and the command never runs."""
    ran = tmp_path / "ran"
    code, out, err = run_kda(["record", "run", str(tmp_path / "x.safetensors"), *args, "--", sys.executable, "-c",
                              f"open({str(ran)!r}, 'w')"], capfd, monkeypatch)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1
    assert lines[0].startswith("Error: ") and message in lines[0]
    assert not ran.exists() and not list(tmp_path.glob("x.safetensors*"))


def test_patch_names_are_looked_up_where_the_program_will_import_from(tmp_path, monkeypatch):
    """A module beside the script, in the current folder or on PYTHONPATH is found, none of
    them imported; a command of another environment is not second-guessed."""
    from traces.record.run import unfound_patches

    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "serve.py").write_text("import engine_kernels\n")
    (tmp_path / "app" / "engine_kernels.py").write_text("raise SystemExit('imported')\n")
    (tmp_path / "lib" / "vendor").mkdir(parents=True)
    (tmp_path / "lib" / "vendor" / "__init__.py").write_text("raise SystemExit('imported')\n")
    (tmp_path / "lib" / "vendor" / "ops.py").write_text("")
    (tmp_path / "lib" / "spread" / "inner").mkdir(parents=True)  # namespace packages, as tests/broken_impls is
    (tmp_path / "lib" / "spread" / "inner" / "ops.py").write_text("")
    python = [sys.executable, "app/serve.py"]
    monkeypatch.chdir(tmp_path)
    assert unfound_patches(["engine_kernels", "app.serve", "kernels.reference", "vendor.ops", "spread.inner.ops",
                            "vendor.nosuch", "spread.inner.nosuch", "nosuch"], python, str(tmp_path / "lib")) == \
        ["vendor.nosuch", "spread.inner.nosuch", "nosuch"]
    assert unfound_patches(["nosuch"], ["sh", "run.sh"], None) == []
    assert not {"engine_kernels", "vendor", "spread"} & set(sys.modules)


def test_a_trace_left_by_an_earlier_run_is_not_reported_as_recorded(tmp_path, capfd, monkeypatch):
    """A command that records nothing over an existing OUT: nothing recorded (exit 3), the
    old file as it was."""
    path = tmp_path / "run.safetensors"
    code, _, err = run_kda(["record", "run", str(path), *PATCHES, "--", sys.executable, SCRIPT, "1"], capfd,
                           monkeypatch)
    assert code == 0, err
    before = path.read_bytes()
    code, out, err = run_kda(["record", "run", str(path), *PATCHES, "--force", "--", sys.executable, "-c", "pass"],
                             capfd, monkeypatch)
    assert code == 3 and "wrote" not in out + err, out + err
    assert err.strip().splitlines()[-1] == \
        "Error: nothing was recorded: was tests.support.documented_surface, kernels imported?"
    assert path.read_bytes() == before


def test_calls_during_a_capture_are_forwarded_whole_and_counted(tmp_path, capsys, monkeypatch):
    """With the stream capturing (forced here; the GPU test below captures for real) nothing is
    recorded, fused calls reach the implementation fused, and one stderr line says why."""
    import traces.record.recorder as record
    from tests.support.decode_loop import decode_loop

    monkeypatch.setattr(record, "capturing", lambda: True)
    path = tmp_path / "captured.safetensors"
    with record_trace(path, "reference") as api:
        decode_loop(api, "deferred", steps=3, fused=True)
        skipped = dict(api.skipped)
    assert skipped == {"captured": 3 * 3 + 1}  # flush_verify, plan_deferred, commit a step; the last flush
    assert not path.exists()
    assert capsys.readouterr().err.count(CAPTURED_NOTE) == 1


@pytest.mark.gpu
@pytest.mark.gpu_only
def test_a_captured_step_runs_as_without_the_recorder_and_eager_steps_are_recorded(tmp_path, capfd, monkeypatch):
    """verify, plan, commit captured in a CUDA graph under the recorder: the capture succeeds,
    its replays give bit for bit what the same graph captured without the recorder gives, the
    captured calls are counted (``captured``) with one line on stderr, and the trace holds the
    eager step, which replays."""
    from tests.support.decode_loop import ACT, H, K, LOWER_BOUND, T, V
    import kernels

    def buffers(seed: int) -> dict:
        g = torch.Generator().manual_seed(seed)
        lens = [T, 2, 3]
        x = {"pool": torch.randn(4, H, V, K, generator=g) * 0.5,
             "A_log": torch.log(torch.empty(H).uniform_(1.0, 16.0, generator=g)),
             "dt_bias": torch.randn(H * K, generator=g) * 0.5,
             "q": torch.randn(1, sum(lens), H, K, generator=g).to(ACT), "k": torch.randn(1, sum(lens), H, K, generator=g).to(ACT),
             "v": torch.randn(1, sum(lens), H, V, generator=g).to(ACT),
             "raw_g": torch.randn(1, sum(lens), H, K, generator=g).to(ACT),
             "raw_beta": torch.randn(1, sum(lens), H, generator=g).to(ACT),
             "qsl": torch.tensor([0, T, T + 2, T + 5], dtype=torch.int32),
             "slots": torch.tensor([1, 2, 3], dtype=torch.int32), "accepted": torch.tensor([T, 1, 2], dtype=torch.int32)}
        x = {name: t.cuda() for name, t in x.items()}
        x["pool"][0] = 0
        x["records"] = kernels.allocate_records(3, H, T, K, V, ACT, "cuda")
        x["plan"] = kernels.CommitPlan.allocate(3, "cuda")
        x["out"] = torch.empty_like(x["v"])
        return x

    def step(api, x) -> None:
        api.kda_recoverssm_verify(x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], x["A_log"], x["dt_bias"],
                                  LOWER_BOUND, x["pool"], x["records"], x["qsl"], x["slots"], T, out=x["out"])
        api.kda_recoverssm_plan(x["plan"], x["accepted"], x["qsl"], x["slots"], T)
        api.kda_recoverssm_commit(x["pool"], x["records"], x["A_log"], x["dt_bias"], LOWER_BOUND, x["slots"],
                                  x["plan"])

    def captured(api, x) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step(api, x)
        return graph

    path = tmp_path / "graphs.safetensors"
    recorded, plain = buffers(0), buffers(0)
    step(kernels, plain)  # the eager step, as the recorded side runs it
    with record_trace(path, "kernels") as api:
        step(api, recorded)
        graph = captured(api, recorded)
        for _ in range(3):
            graph.replay()
    baseline = captured(kernels, plain)
    for _ in range(3):
        baseline.replay()
    torch.cuda.synchronize()
    for name in ("pool", "out"):
        assert torch.equal(recorded[name], plain[name]), f"{name} differs from the graph without the recorder"
    assert torch.equal(recorded["records"].correction, plain["records"].correction)
    assert capfd.readouterr().err.count(CAPTURED_NOTE) == 1
    with read_trace(path) as trace:
        assert [e.op for e in trace.events] == ["verify", "plan", "commit"]
        assert trace.manifest.provenance["skipped_calls"] == {"captured": 3}
    _replays(path, "triton", capfd, monkeypatch)


def _fused_engine(recorder=None):
    """An engine module with the fused calls but not ``kda_recoverssm_flush`` (its last flush
    comes from elsewhere), patched for ``recorder``; returns it and the pool its run left."""
    import types

    import kernels.reference as ref
    from traces.record.patch import patch_module

    module = types.ModuleType("fused_engine")
    for name in ("allocate_records", "CommitPlan", "kda_recoverssm_verify", "kda_recoverssm_flush_verify",
                 "kda_recoverssm_plan", "kda_recoverssm_defer", "kda_recoverssm_plan_deferred",
                 "kda_recoverssm_commit"):
        setattr(module, name, getattr(ref, name))
    if recorder is not None:
        patch_module(module, recorder)
    left = []

    def last_flush(pool, *args):
        ref.kda_recoverssm_flush(pool, *args)
        left.append(pool)

    return types.SimpleNamespace(**vars(module), kda_recoverssm_flush=last_flush), left


def test_a_fused_call_without_its_parts_ends_the_recording_and_runs(tmp_path):
    """The fused flush-verify of a module without ``kda_recoverssm_flush`` cannot be recorded
    as its parts: it runs as it would unrecorded, and the recording ends before it, saying why."""
    from tests.support.decode_loop import decode_loop
    from traces.record.patch import PatchRecorder

    plain, plain_pool = _fused_engine()
    decode_loop(plain, "deferred", steps=2, fused=True)
    recorder = PatchRecorder(tmp_path / "t.safetensors", ["fused_engine"])
    engine, pool = _fused_engine(recorder)
    decode_loop(engine, "deferred", steps=2, fused=True)
    assert torch.equal(pool[0], plain_pool[0])
    assert recorder.stopped == "kda_recoverssm_flush_verify without kda_recoverssm_flush"
    assert recorder.events == 0 and recorder.skipped == {"plan": 2, "defer": 2, "commit": 2}


def test_a_raw_kernel_on_a_grid_that_is_not_one_program_a_row_ends_the_recording(tmp_path):
    from traces.record.patch import PatchRecorder

    recorder = PatchRecorder(tmp_path / "t.safetensors", ["engine"])
    launched = []
    recorder.launch_kernel("_defer_commit_kernel", lambda *a, **k: launched.append(True), (4, 2), (),
                           {"pending_ptr": torch.zeros(4, dtype=torch.int32)})
    assert launched == [True]
    assert recorder.stopped == "_defer_commit_kernel launched on a grid other than (rows,)"
