"""Recording the verifies a CUDA graph holds, at each replay (``traces.record.graph_calls``): an
engine-like decode loop whose verify is captured in a graph (``tests.support.graph_fakes.FakeGraph`` on the
CPU, ``torch.cuda.CUDAGraph`` with CUDA) and whose plan and commit run eagerly after each replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.support.graph_fakes import FakeGraph, fake_hooks, torch_capturing
from tests.support.trace_helpers import run_kda
from traces.format.io import read_trace
from traces.record.graph_calls import follow_graphs
from traces.record.graphs import GraphHooks
from traces.record.recorder import Recorder, options_from_env, RecordError

H, K, V, T = 2, 16, 16, 4
ACT = torch.bfloat16
LOWER_BOUND = -5.0
LENS = [T, T, T, 0]  # three requests and one padding row
STEPS = 3


class Engine:
    """A decode step's static buffers; ``verify()`` is what its graph captures, ``commit(step)``
    what it runs eagerly after each replay."""

    def __init__(self, api, device, seed: int = 0):
        self.api, self.device = api, device
        self.g = torch.Generator().manual_seed(seed)
        pool = (torch.randn(4, H, V, K, generator=self.g) * 0.5).to(device)
        pool[0] = 0
        self.pool = pool
        self.records = api.allocate_records(len(LENS), H, T, K, V, ACT, device)
        self.plan = api.CommitPlan.allocate(len(LENS), device)
        self.A_log = torch.log(torch.empty(H).uniform_(1.0, 16.0, generator=self.g)).to(device)
        self.dt_bias = (torch.randn(H * K, generator=self.g) * 0.5).to(device)
        self.slots = torch.tensor([1, 2, 3, -1], dtype=torch.int32, device=device)
        self.qsl = torch.tensor([0, *torch.tensor(LENS).cumsum(0).tolist()], dtype=torch.int32, device=device)
        total = sum(LENS)
        self.q, self.k, self.raw_g = (torch.zeros(1, total, H, K, dtype=ACT, device=device) for _ in range(3))
        self.v = torch.zeros(1, total, H, V, dtype=ACT, device=device)
        self.raw_beta = torch.zeros(1, total, H, dtype=ACT, device=device)
        self.out = torch.zeros(1, total, H, V, dtype=ACT, device=device)

    def inputs(self) -> None:
        """New activations, copied into the static inputs."""
        for t in (self.q, self.k, self.raw_g, self.v, self.raw_beta):
            t.copy_(torch.randn(t.shape, generator=self.g).to(ACT))

    def verify(self, q=None) -> None:
        self.api.kda_recoverssm_verify(self.q if q is None else q, self.k, self.v, self.raw_g, self.raw_beta,
                                       self.A_log, self.dt_bias, LOWER_BOUND, self.pool, self.records, self.qsl,
                                       self.slots, T, out=self.out)

    def commit(self, step: int) -> None:
        accepted = torch.tensor([max(1, n - step % 2) for n in LENS[:3]] + [0], dtype=torch.int32, device=self.device)
        self.api.kda_recoverssm_plan(self.plan, accepted, self.qsl, self.slots, T)
        self.api.kda_recoverssm_commit(self.pool, self.records, self.A_log, self.dt_bias, LOWER_BOUND, self.slots,
                                       self.plan)


def run_fake(path: Path, device, graphs: bool, stale: bool = False, written: list | None = None) -> Recorder:
    """The engine under a recorder, its verify captured in a ``FakeGraph`` and replayed ``STEPS``
    times, each with new inputs (their ``q`` appended to ``written``, on the host) and an eager
    commit after it. ``stale``: after the capture the engine re-allocates ``q`` and writes its
    inputs there, while the graph reads the old one."""
    with Recorder(path, "kernels", graphs=graphs) as rec, torch_capturing():
        if graphs:
            rec.recording.graphs = follow_graphs(rec.recording, fake_hooks())
        engine = Engine(rec, device)
        graph = FakeGraph()
        captured_q = engine.q
        graph.capture(lambda: engine.verify(captured_q))
        if stale:
            engine.q = torch.zeros_like(captured_q)
        for step in range(STEPS):
            engine.inputs()
            if written is not None:
                written.append(engine.q.cpu().clone())
            graph.replay()
            engine.commit(step)
    return rec


def events(path: Path) -> list:
    with read_trace(path) as trace:
        return list(trace.manifest.events)


def replay(path: Path, impl: str, capsys, monkeypatch) -> tuple[int, dict]:
    code, out, err = run_kda(["replay", str(path), "--impl", impl, "--format", "json", "--no-progress"],
                             capsys, monkeypatch)
    return code, json.loads(out)


def test_each_replay_of_a_captured_verify_is_a_verify_event_and_replays(tmp_path, capsys, monkeypatch, device):
    path = tmp_path / "graphs.safetensors"
    rec = run_fake(path, device, graphs=True)
    evs = events(path)
    ops = [e.op for e in evs if e.op != "write"]
    assert ops == ["verify", "plan", "commit"] * STEPS
    verifies = [e for e in evs if e.op == "verify"]
    assert [e.attrs for e in verifies] == [{"graph_replay": n} for n in range(1, STEPS + 1)]
    assert "captured" not in rec.skipped
    for impl in ("triton", "reference"):
        code, report = replay(path, impl, capsys, monkeypatch)
        assert code == 0 and report["passed"] is True, report
    code, out, _ = run_kda(["info", str(path)], capsys, monkeypatch)
    assert code == 0 and f"events from CUDA graph replays: {STEPS}" in out
    code, out, _ = run_kda(["info", str(path), "--format", "json"], capsys, monkeypatch)
    assert json.loads(out)["events_from_graph_replays"] == STEPS


def test_a_slice_of_a_graph_trace_keeps_its_replay_numbers_and_replays(tmp_path, capsys, monkeypatch, device):
    """``kda slice`` from the second step on: the verifies it keeps carry the replay numbers they
    were recorded at, and the slice replays through kda's kernels."""
    path, cut = tmp_path / "graphs.safetensors", tmp_path / "cut.safetensors"
    run_fake(path, device, graphs=True)
    first = next(i for i, e in enumerate(events(path)) if e.op == "verify" and e.attrs["graph_replay"] == 2)
    code, _, err = run_kda(["slice", str(path), "--events", f"{first}:", "--out", str(cut)], capsys, monkeypatch)
    assert code == 0, err
    assert [e.attrs["graph_replay"] for e in events(cut) if e.op == "verify"] == list(range(2, STEPS + 1))
    code, report = replay(cut, "triton", capsys, monkeypatch)
    assert code == 0 and report["passed"] is True, report


def test_the_verify_events_hold_what_each_replay_read(tmp_path, device):
    """Each verify's inputs are those copied in before its replay, not what the buffers hold at
    the end, and its records seen first are those before the call."""
    path = tmp_path / "graphs.safetensors"
    written: list[torch.Tensor] = []
    run_fake(path, device, graphs=True, written=written)
    with read_trace(path) as trace:
        qs = [trace.tensor(e.inputs["q"]) for e in trace.manifest.events if e.op == "verify"]
    assert len(qs) == STEPS and all(torch.equal(q, w) for q, w in zip(qs, written))
    assert not torch.equal(qs[0], qs[1])


def test_without_graphs_captured_calls_are_passed_through_as_before(tmp_path, device):
    path = tmp_path / "eager.safetensors"
    rec = run_fake(path, device, graphs=False)
    evs = events(path)
    assert [e.op for e in evs if e.op != "write"] == ["plan", "commit"] * STEPS
    assert rec.skipped == {"captured": 1 + STEPS}  # the capture, and each fake replay re-running it
    with read_trace(path) as trace:
        assert "graphs" not in trace.manifest.provenance


def test_a_verify_input_reallocated_after_capture_is_recorded_as_the_graph_read_it(tmp_path, capsys, monkeypatch,
                                                                                   device):
    """The graph reads the old ``q`` (zeros: the engine writes the new one): the trace holds what
    the replayed verify read, so it replays exactly; the engine's own inputs never reach it."""
    path = tmp_path / "stale.safetensors"
    run_fake(path, device, graphs=True, stale=True)
    with read_trace(path) as trace:
        qs = [trace.tensor(e.inputs["q"]) for e in trace.manifest.events if e.op == "verify"]
    assert len(qs) == STEPS and all(not q.any() for q in qs)
    code, report = replay(path, "reference", capsys, monkeypatch)
    assert code == 0, report


def test_a_graph_the_hooks_did_not_see_captured_stops_the_recording(tmp_path, device, capsys):
    path = tmp_path / "unseen.safetensors"
    with Recorder(path, "kernels", graphs=True) as rec, torch_capturing():
        engine = Engine(rec, device)
        graph = FakeGraph()
        graph.capture(engine.verify)  # before the hooks
        rec.recording.graphs = follow_graphs(rec.recording, fake_hooks())
        engine.inputs()
        engine.commit(0)
        graph.replay()
        engine.commit(1)
    assert rec.stopped and "graph hooks" in rec.stopped  # the fake re-runs the verify: no capture they saw
    assert [e.op for e in events(path) if e.op != "write"] == ["plan", "commit"]
    assert not hasattr(FakeGraph.replay, "_graph_hooks")  # uninstalled at close


def test_the_hooks_are_installed_for_the_life_of_the_recording(tmp_path):
    with Recorder(tmp_path / "t.safetensors", "kernels", graphs=True) as rec:
        rec.recording.graphs = follow_graphs(rec.recording, fake_hooks())
        assert hasattr(FakeGraph.replay, "_graph_hooks")
    assert not hasattr(FakeGraph.replay, "_graph_hooks")


def test_the_option_reaches_the_recorder_from_the_environment(tmp_path):
    from traces.record.run import child_env

    assert child_env(tmp_path / "t.safetensors", graphs=True, base={})[0]["KDA_RECORD_GRAPHS"] == "1"
    assert child_env(tmp_path / "t.safetensors", base={})[0]["KDA_RECORD_GRAPHS"] == "0"
    assert options_from_env({"KDA_RECORD_GRAPHS": "1"}) == {"graphs": True}
    assert options_from_env({"KDA_RECORD_GRAPHS": "0"}) == {"graphs": False}
    with pytest.raises(RecordError, match="KDA_RECORD_GRAPHS"):
        options_from_env({"KDA_RECORD_GRAPHS": "yes"})


@pytest.mark.gpu_only
def test_a_verify_in_a_cuda_graph_is_recorded_at_each_replay(tmp_path, capsys, monkeypatch, device):
    path = tmp_path / "cuda.safetensors"
    with Recorder(path, "kernels", graphs=True) as rec:
        assert rec.recording.graphs is not None and isinstance(rec.recording.graphs.hooks, GraphHooks)
        engine = Engine(rec, device)
        engine.inputs()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up (compiles) outside the capture, unrecorded: an eager verify
            engine.verify()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            engine.verify()
        for step in range(STEPS):
            engine.inputs()
            graph.replay()
            engine.commit(step)
    verifies = [e for e in events(path) if e.op == "verify"]
    assert [e.attrs.get("graph_replay") for e in verifies] == [None, *range(1, STEPS + 1)]
    for impl in ("triton", "reference"):
        code, report = replay(path, impl, capsys, monkeypatch)
        assert code == 0 and report["passed"] is True, report
