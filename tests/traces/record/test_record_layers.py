"""Recording a model of several layers and its commit context, unedited (``kda record run
--patch MODULE --layers``): ``tests/support/context_engine.py`` runs three layers with conv state and
commits them through ``KDARecoverSSMCommitContext``; its recording is a v2 trace that replays
exactly through kda's kernels, through the reference and through the module. A subset of
layers is recorded when no context is used; a context's commit that is wrong in one layer's
conv window is reported at that layer, slot and position; what v2 cannot hold ends the
recording with its reason."""

from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path

import pytest
import torch

from tests.support.trace_helpers import rewrite, run_kda
from traces.format.io import read_trace

REPO = Path(__file__).resolve().parents[3]
ENGINE = str(REPO / "tests" / "support" / "context_engine.py")
SURFACE = "tests.support.context_surface"
BROKEN = "tests.broken_impls.conv_window_one_layer"
STEPS = 3
"""Decode steps of a recording: a slot is reused at the third (``tests/support/context_engine.py``)."""


def record(path: Path, capfd, monkeypatch, layers: str = "all", module: str = SURFACE,
           engine_args: tuple[str, ...] = ()) -> tuple[int, str, str]:
    extra = ("--module", module) if module != SURFACE else ()
    return run_kda(["record", "run", str(path), "--patch", module, "--layers", layers, "--", sys.executable, ENGINE,
                    "--steps", str(STEPS), *extra, *engine_args], capfd, monkeypatch)


def replay(path: Path, impl: str, capfd, monkeypatch, *extra: str) -> tuple[int, dict]:
    code, out, err = run_kda(["replay", str(path), "--impl", impl, "--no-progress", "--format", "json", *extra], capfd,
                             monkeypatch)
    assert "Traceback" not in out + err
    return code, json.loads(out)


def _context_module(name: str, monkeypatch, base=None) -> types.ModuleType:
    """A module ``name`` (in ``sys.modules`` for this test) with kda's kernel API, its raw
    kernels under the documented surface's names, and a commit context that subclasses ``base``
    (kda's), so that patching it leaves kda's class as it is."""
    import kernels
    from kernels.context.engine import KDARecoverSSMCommitContext as kda_context

    module = types.ModuleType(name)
    module.__dict__.update({api: getattr(kernels, api) for api in kernels.__all__})
    module._defer_commit_kernel, module._prepare_flush_plan_kernel = (kernels.defer_commit_kernel,
                                                                      kernels.prepare_flush_plan_kernel)
    module.KDARecoverSSMCommitContext = type("KDARecoverSSMCommitContext", (base or kda_context,), {})
    monkeypatch.setitem(sys.modules, name, module)
    return module


def _recorded_context(name: str, monkeypatch, path: Path, base=None):
    """``_context_module(name, monkeypatch, base)`` patched for a ``PatchRecorder`` of every
    layer into ``path``: (module, recorder)."""
    from traces.record.patch import PatchRecorder, patch_module

    module = _context_module(name, monkeypatch, base)
    recorder = PatchRecorder(path, [module.__name__], layers="all")
    patch_module(module, recorder)
    return module, recorder


@pytest.fixture(scope="module")
def context_trace(tmp_path_factory) -> Path:
    """The engine with its commit context (dim_first conv state), recorded with --layers all."""
    path = tmp_path_factory.mktemp("layers") / "context.safetensors"
    with pytest.MonkeyPatch.context() as monkeypatch:
        code, _, err = run_kda(["record", "run", str(path), "--patch", SURFACE, "--layers", "all", "--", sys.executable,
                                ENGINE, "--steps", str(STEPS)], _NoCapture(), monkeypatch)
    assert code == 0, err
    return path


class _NoCapture:
    """``run_kda``'s capture for a module-scoped fixture (no pytest capture fixture there)."""

    def readouterr(self) -> tuple[str, str]:
        return "", ""


@pytest.mark.gpu
def test_an_engine_with_a_commit_context_records_every_layer_and_its_commit(context_trace):
    with read_trace(context_trace) as trace:
        m = trace.manifest
        ops = [(e.op, e.attrs.get("layer", 0)) for e in trace.events]
        writes = [e.inputs for e in trace.events if e.op == "write"]
        commit = next(e for e in trace.events if e.op == "commit_layers")
        shapes = {role: trace.meta(name).shape for role, name in commit.expected.items()}
    assert (m.version, m.num_layers, m.conv.layout, m.conv.dim, m.conv.width) == (2, 3, "dim_first", 8, 3)
    assert [op for op, _ in ops].count("commit_layers") == STEPS and {("verify", i) for i in range(3)} <= set(ops)
    assert {"plan", "commit"}.isdisjoint(op for op, _ in ops)
    assert set(commit.inputs) == {"num_accepted", "state_indices", "query_start_loc", "request_indices"}
    M = shapes["slots"][0]
    assert shapes["states"] == (3, M, 2, 16, 16) and shapes["conv_windows"] == (3, M, 8, 2)
    assert any("conv_slots" in w for w in writes)  # the engine's convolution updates
    assert any("slots" in w for w in writes)  # the prefill of a reused slot
    assert m.provenance["layers"] == "all" and m.provenance["stopped_by"] is None


@pytest.mark.gpu
@pytest.mark.parametrize("impl, exact", [("triton", True), ("reference", False),
                                         ("tests/support/context_surface.py", True)])
def test_the_recording_replays_through_kda_the_reference_and_the_module(context_trace, impl, exact, capfd,
                                                                        monkeypatch):
    code, report = replay(context_trace, impl, capfd, monkeypatch, *(["--atol", "0", "--rtol", "0"] if exact else []))
    assert code == 0 and report["passed"]
    compared = {c["role"] for e in report["events"] if e["op"] == "commit_layers" for c in e["tensors"]}
    assert compared == {"states", "conv_windows"}


def test_without_its_conv_writes_the_recording_fails(context_trace, tmp_path, capfd, monkeypatch):
    """The engine's conv updates, written outside the kernels, are in the trace: without them
    the commit's conv windows differ."""
    def drop_conv_writes(manifest, tensors):
        for e in manifest["events"]:
            if e["op"] == "write" and "conv_slots" in e["inputs"]:
                for name in e["inputs"].values():
                    del tensors[name]
        manifest["events"] = [e for e in manifest["events"] if not (e["op"] == "write"
                                                                    and "conv_slots" in e["inputs"])]

    stripped = rewrite(context_trace, tmp_path / "stripped.safetensors", drop_conv_writes)
    code, report = replay(stripped, "triton", capfd, monkeypatch)
    assert code == 1
    assert any(not c["passed"] for e in report["events"] if e["op"] == "commit_layers" for c in e["tensors"]
               if c["role"] == "conv_windows")


@pytest.mark.gpu
def test_a_token_first_conv_state_is_recorded_and_replays(tmp_path, capfd, monkeypatch):
    path = tmp_path / "token-first.safetensors"
    code, _, err = record(path, capfd, monkeypatch, engine_args=("--layout", "token_first"))
    assert code == 0, err
    with read_trace(path) as trace:
        assert trace.manifest.conv.layout == "token_first"
    code, report = replay(path, "triton", capfd, monkeypatch, "--atol", "0", "--rtol", "0")
    assert code == 0 and report["passed"]


@pytest.mark.gpu
def test_a_wrong_conv_window_in_one_layer_is_reported_at_its_layer_slot_and_position(tmp_path, capfd, monkeypatch):
    """The engine's context shifts layer 1's window of the first slot each commit writes: its
    recording expects that, kda's commit disagrees there and nowhere else."""
    path = tmp_path / "broken.safetensors"
    code, _, err = record(path, capfd, monkeypatch, module=BROKEN)
    assert code == 0, err
    with read_trace(path) as trace:
        index, commit = next((i, e) for i, e in enumerate(trace.events) if e.op == "commit_layers")
        first_slot = int(trace.tensor(commit.expected["slots"])[0])
    code, report = replay(path, "triton", capfd, monkeypatch, "--stop-at-first")
    assert code == 1
    bad = [c for e in report["events"] for c in e["tensors"] if not c["passed"]]
    assert [c["role"] for c in bad] == ["conv_windows"]
    first = bad[0]["first_bad"]
    assert (first["event"], first["layer"], first["slot"], first["channel"], first["position"]) == \
        (index, 1, first_slot, 0, 0)
    code, report = replay(path, BROKEN.replace(".", "/") + ".py", capfd, monkeypatch)
    assert code == 0 and report["passed"]


@pytest.mark.gpu
def test_layers_records_a_subset_of_an_engine_without_a_context(tmp_path, capfd, monkeypatch):
    path = tmp_path / "subset.safetensors"
    code, _, err = record(path, capfd, monkeypatch, layers="0,2", engine_args=("--no-context",))
    assert code == 0, err
    from tests.support import context_engine

    g = torch.Generator().manual_seed(0)
    model = [context_engine.new_layer(importlib.import_module(SURFACE), g, True) for _ in range(3)]
    with read_trace(path) as trace:
        m = trace.manifest
        A_log = [trace.tensor(m.layer(i).params["A_log"]) for i in range(m.num_layers)]
        ops = {(e.op, e.attrs.get("layer", 0)) for e in trace.events}
    assert (m.version, m.num_layers, m.conv) == (2, 2, None)
    assert torch.equal(A_log[0], model[0].A_log.cpu()) and torch.equal(A_log[1], model[2].A_log.cpu())
    assert {("verify", 0), ("verify", 1), ("plan", 0), ("commit", 0), ("commit", 1)} <= ops
    assert m.provenance["layers"] == "0,2" and m.provenance["skipped_calls"]["other_layer"] == STEPS * 2
    code, report = replay(path, "triton", capfd, monkeypatch, "--atol", "0", "--rtol", "0")
    assert code == 0 and report["passed"]


def test_a_context_over_more_layers_than_chosen_stops_the_recording(tmp_path, capfd, monkeypatch):
    path = tmp_path / "subset.safetensors"
    code, _, err = run_kda(["record", "run", str(path), "--patch", SURFACE, "--layers", "0,2", "--", sys.executable,
                            ENGINE, "--steps", "1"], capfd, monkeypatch)
    assert code == 3 and not path.exists()
    assert ("kda record: recording stopped: a commit context holds 3 layers and --layers 0,2 chose some: record it "
            "with --layers all") in err


@pytest.mark.parametrize("args, message", [
    (["--layers", "0,x"], "--layers 0,x: expected all or layer numbers >= 0 such as 0,7"),
    (["--layers", "1,1"], "--layers 1,1: a layer named twice"),
    (["--layers", "all", "--layer", "1"], "--layer and --layers: give one"),
])
def test_bad_layers_are_refused_before_the_command_runs(tmp_path, args, message, capfd, monkeypatch):
    ran = tmp_path / "ran"
    code, out, err = run_kda(["record", "run", str(tmp_path / "x.safetensors"), "--patch", SURFACE, *args, "--",
                              sys.executable, "-c", f"open({str(ran)!r}, 'w')"], capfd, monkeypatch)
    assert code == 2 and err.strip().startswith("Error: ") and message in err and len(err.strip().splitlines()) == 1
    assert not ran.exists()


def test_a_raw_kernel_inside_the_context_commit_ends_the_recording_before_it(tmp_path, monkeypatch):
    """A context whose commit defers through the raw kernel on its plan: trace format v2 cannot
    say what it did, so the recording ends before that commit, the events before it kept."""
    import kernels
    from kernels.context.engine import KDARecoverSSMCommitContext as Base
    from tests.support import context_engine

    class Deferring(Base):
        def commit(self, num_accepted_tokens, state_indices, query_start_loc, request_indices=None, **kwargs):
            B = state_indices.shape[0]
            pending = torch.zeros(context_engine.SLOTS, dtype=torch.int32, device=state_indices.device)
            module._defer_commit_kernel[(B,)](state_indices, self.plan.commit_lens, state_indices, pending, None,
                                              kernels.NULL_BLOCK_ID, state_indices.stride(0))
            return super().commit(num_accepted_tokens, state_indices, query_start_loc, request_indices, **kwargs)

    module, recorder = _recorded_context("deferring_engine", monkeypatch, tmp_path / "t.safetensors", Deferring)
    context_engine.main(2, True, module.__name__, True)
    assert recorder.stopped == ("_defer_commit_kernel launched inside KDARecoverSSMCommitContext.commit: the "
                                "commit_layers event of trace format v2 holds no defer or flush plan")
    result = recorder.close()
    with read_trace(result.path) as trace:
        ops = [e.op for e in trace.events]
    assert "commit_layers" not in ops and ops.count("verify") == 3


@pytest.mark.gpu
def test_an_align_mode_commit_is_recorded_with_its_block_table(tmp_path, capfd, monkeypatch, device):
    """Align mode: the commit writes final and boundary slots from the block table, which the
    trace describes before the call and expects after it; the engine's writes between commits
    are writes of every layer."""
    import kernels
    from tests.support import context_engine

    module, recorder = _recorded_context("align_engine", monkeypatch, tmp_path / "align.safetensors")
    monkeypatch.setattr(context_engine, "DEVICE", device)
    g = torch.Generator().manual_seed(1)
    layers = [context_engine.new_layer(kernels, g, True) for _ in range(3)]
    for layer in layers:  # the records of an earlier verify
        for records in layer.kv_cache[2:]:
            records.copy_(torch.randn(records.shape, generator=g).to(records.dtype) * 0.1)
    context = module.KDARecoverSSMCommitContext.create(layers, spec_query_len=context_engine.T, max_num_reqs=4)

    def i32(values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    for _ in range(2):
        for layer in layers:
            layer.kv_cache[0][1:3] += 1
        # row 0 (request 2) crosses the boundary of block 0 into slot 3, row 1 (request 0) stays in block 1
        context.commit(i32([2, 0, 3, 0, 1]), i32([1, 2, 0, -1]), i32([0, 4, 7, 9, 9]),
                       request_indices=i32([2, 0, 1, 3]), block_table=i32([[2, 4], [0, 0], [1, 3], [0, 0], [0, 0]]),
                       num_computed_tokens=i32([5, 0, 2, 0, 0]), mamba_block_size=4)
    path = recorder.close().path
    with read_trace(path) as trace:
        commits = [e for e in trace.events if e.op == "commit_layers"]
        written = trace.tensor(commits[0].expected["slots"]).tolist()
        writes = [e.attrs.get("layer", 0) for e in trace.events if e.op == "write"]
    assert len(commits) == 2 and commits[0].attrs == {"block_size": 4}
    assert {"block_table", "num_computed"} <= set(commits[0].inputs) and 3 in written
    assert writes == [0, 1, 2]
    code, report = replay(path, "triton", capfd, monkeypatch, "--atol", "0", "--rtol", "0")
    assert code == 0 and report["passed"]


def test_a_context_commit_inside_a_capture_is_passed_through(tmp_path, monkeypatch):
    """With the stream capturing (forced here), the context's commits and the verifies run as
    without the recorder and are counted as captured; nothing is recorded."""
    import traces.record.commit_context as context_recording
    import traces.record.patch as patching
    from tests.support import context_engine

    module, recorder = _recorded_context("captured_engine", monkeypatch, tmp_path / "t.safetensors")
    for where in (context_recording, patching):
        monkeypatch.setattr(where, "capturing", lambda: True)
    context_engine.main(2, True, module.__name__, True)
    assert recorder.skipped == {"captured": 2 * (3 + 1)} and recorder.events == 0
    assert recorder.close() is None


def test_a_context_the_recorder_cannot_read_ends_the_recording_and_runs(tmp_path, monkeypatch):
    """A context whose commit names its arguments otherwise, and one over layers of differing
    shapes: the recording ends there, saying why, and the engine runs as it would."""
    import kernels
    from kernels.context.engine import KDARecoverSSMCommitContext as Base
    from tests.support import context_engine

    class Renamed(Base):
        def commit(self, accepted, slots, starts, request_indices=None):
            return super().commit(accepted, slots, starts, request_indices)

    module, recorder = _recorded_context("renamed_engine", monkeypatch, tmp_path / "renamed.safetensors", Renamed)
    context_engine.main(1, True, module.__name__, True)
    assert recorder.stopped == ("KDARecoverSSMCommitContext.commit: no num_accepted_tokens, state_indices, "
                                "query_start_loc among its arguments (kda's names)")
    with read_trace(recorder.close().path) as trace:
        assert "commit_layers" not in [e.op for e in trace.events]

    class Unchecked(Base):
        @classmethod
        def create(cls, layers, spec_query_len, max_num_reqs, conv_dim_first=True):
            context = object.__new__(cls)
            context.plan = kernels.CommitPlan.allocate(max_num_reqs, "cpu")
            return context

    module, recorder = _recorded_context("unchecked_engine", monkeypatch, tmp_path / "unchecked.safetensors", Unchecked)
    g = torch.Generator().manual_seed(0)
    layers = [context_engine.new_layer(kernels, g, True) for _ in range(2)]
    layers[1].A_log = torch.zeros(3)
    module.KDARecoverSSMCommitContext.create(layers, context_engine.T, 4)
    assert recorder.stopped == ("layer 1's A_log is [3] torch.float32, layer 0's [2] torch.float32: the layers of a "
                                "trace share their shapes")
    assert recorder.close() is None
