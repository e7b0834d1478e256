"""The copies a ``GraphTape`` captures into a graph, read back at each replay (``traces.record.graphs``),
on ``tests.support.graph_fakes.FakeGraph`` and, with CUDA, on ``torch.cuda.CUDAGraph``."""

from __future__ import annotations

import pytest
import torch

from tests.support.graph_fakes import FakeGraph, fake_hooks, is_capturing, torch_capturing
from traces.record.graphs import Gathered, GraphHooks, GraphRecordError, GraphTape

ROWS, WIDTH = 6, 3


class Step:
    """A graph's body of two recorded calls: ``scale`` reads ``x`` and the pool's rows at ``idx``,
    writes ``out = 2x`` and adds 1 to those rows (null rows, -1, skipped); ``shift`` reads ``out``
    and writes ``out + 1`` into ``shifted``. Each call hands the tape what it reads and writes."""

    def __init__(self, tape: GraphTape, device):
        self.tape = tape
        self.pool = torch.arange(ROWS * WIDTH, dtype=torch.float32, device=device).view(ROWS, WIDTH)
        self.x = torch.zeros(4, device=device)
        self.idx = torch.zeros(3, dtype=torch.int32, device=device)
        self.out = torch.zeros(4, device=device)
        self.shifted = torch.zeros(4, device=device)

    def __call__(self) -> None:
        k = self.tape.before("scale", {"x": self.x, "rows": (self.pool, self.idx)}, {"factor": 2, "tag": "s"},
                             keep=self.pool)
        self.out.copy_(self.x * 2)
        valid = (self.idx >= 0).to(self.pool.dtype)[:, None].expand(-1, WIDTH)
        self.pool.index_add_(0, self.idx.clamp(min=0).long(), valid)
        self.tape.after(k, {"out": self.out, "rows": (self.pool, self.idx)})
        k = self.tape.before("shift", {"out": self.out})
        torch.add(self.out, 1, out=self.shifted)
        self.tape.after(k, {"shifted": self.shifted})

    def bytes(self) -> int:
        """What the tape holds for one capture of the step: each snap's copy; a gather's index,
        its int64 clamp and its rows."""
        gather = 3 * 4 + 3 * 8 + 3 * WIDTH * 4
        return (16 + gather) + (16 + gather) + 16 + 16


def rows_at(pool: torch.Tensor, idx: list[int]) -> torch.Tensor:
    return torch.stack([pool[i] if i >= 0 else torch.zeros(WIDTH) for i in idx])


def replay_twice(graph, step: Step, reads: list) -> list[tuple]:
    """Replay ``graph`` with two inputs; per replay, the host pool before and after it."""
    pools = []
    for x, idx in (([1.0, 2.0, 3.0, 4.0], [4, -1, 1]), ([-1.0, 0.5, 0.0, 8.0], [-1, 5, 0])):
        step.x.copy_(torch.tensor(x))
        step.idx.copy_(torch.tensor(idx, dtype=torch.int32))
        before = step.pool.cpu().clone()
        graph.replay()
        pools.append((x, idx, before, step.pool.cpu().clone()))
    assert len(reads) == 2
    return pools


def check_replays(reads: list, pools: list[tuple]) -> None:
    for calls, (x, idx, pool_before, pool_after) in zip(reads, pools):
        assert [c.name for c in calls] == ["scale", "shift"]
        scale, shift = calls
        assert scale.attrs == {"factor": 2, "tag": "s"} and shift.attrs == {}
        assert torch.equal(scale.before["x"], torch.tensor(x))
        for snap, pool in ((scale.before["rows"], pool_before), (scale.after["rows"], pool_after)):
            assert isinstance(snap, Gathered)
            assert snap.index.tolist() == idx
            assert snap.valid.tolist() == [i >= 0 for i in idx]
            assert torch.equal(snap.rows, rows_at(pool, idx))
        assert torch.equal(scale.after["out"], torch.tensor(x) * 2)
        assert torch.equal(shift.before["out"], torch.tensor(x) * 2)
        assert torch.equal(shift.after["shifted"], torch.tensor(x) * 2 + 1)
        assert all(t.device.type == "cpu" for t in (scale.before["x"], shift.after["shifted"]))


def test_each_replay_reads_its_own_copies_in_capture_order():
    reads: list = []
    with fake_hooks(lambda g: reads.append(tape.read(g))) as hooks:
        tape = GraphTape(hooks)
        step, graph = Step(tape, "cpu"), FakeGraph()
        graph.capture(step)
        assert tape.bytes_held(graph) == step.bytes() == tape.bytes_held()
        buffers = [id(b) for c in tape._tapes[graph].calls for h in c.before.values() for b in h.bufs]
        check_replays(reads, replay_twice(graph, step, reads))
        assert [(c.keep is step.pool, c2.keep) for c, c2 in reads] == [(True, None)] * 2  # kept as given
        assert [id(b) for c in tape._tapes[graph].calls for h in c.before.values() for b in h.bufs] == buffers
        assert tape.bytes_held(graph) == step.bytes()


def test_memory_is_per_graph_and_a_new_capture_replaces_the_old():
    with fake_hooks() as hooks:
        tape = GraphTape(hooks)
        one, two = Step(tape, "cpu"), Step(tape, "cpu")
        first, second = FakeGraph(), FakeGraph()
        first.capture(one)
        second.capture(two)
        assert tape.bytes_held(first) == tape.bytes_held(second) == one.bytes()
        assert tape.bytes_held() == 2 * one.bytes()
        first.capture(lambda: tape.after(tape.before("only", {"x": one.x}), {}))
        assert [c.name for c in tape.read(first)] == ["only"]
        assert tape.bytes_held(first) == 16 and tape.bytes_held() == 16 + one.bytes()
        second.capture(lambda: None)
        assert tape.bytes_held(second) == 0 and tape.bytes_held() == 16
        assert tape.read(second) == []


def test_a_replay_copies_into_the_captured_buffers_only_while_the_graph_replays():
    with fake_hooks() as hooks:
        tape = GraphTape(hooks)
        graph = FakeGraph()
        assert hooks.capturing_graph() is None and hooks.replaying_graph() is None
        seen = []
        graph.capture(lambda: seen.append((hooks.capturing_graph(), hooks.replaying_graph(), is_capturing())))
        graph.replay()
        assert seen == [(graph, None, True), (None, graph, True)]
        assert not is_capturing()
        with pytest.raises(GraphRecordError, match="no graph capture"):
            tape.before("verify", {"x": torch.zeros(1)})


def test_uninstall_restores_the_methods_themselves():
    class Inheriting(FakeGraph):
        pass

    originals = {m: FakeGraph.__dict__[m] for m in ("capture_begin", "capture_end", "replay")}
    cuda = {m: torch.cuda.CUDAGraph.__dict__[m] for m in originals}
    with fake_hooks():
        assert all(FakeGraph.__dict__[m] is not f for m, f in originals.items())
        with pytest.raises(GraphRecordError, match="already hooked"):
            fake_hooks().install()
    assert all(FakeGraph.__dict__[m] is f for m, f in originals.items())
    with GraphHooks(graph_class=Inheriting):
        assert all(m in Inheriting.__dict__ for m in originals)
    assert not any(m in Inheriting.__dict__ for m in originals)
    hooks = GraphHooks().install()  # torch.cuda.CUDAGraph by default
    hooks.uninstall()
    hooks.uninstall()
    assert all(torch.cuda.CUDAGraph.__dict__[m] is f for m, f in cuda.items())


def test_torch_sees_a_fake_capture():
    from traces.record.recorder import capturing

    graph = FakeGraph()
    seen = []
    with torch_capturing():
        assert not capturing()
        graph.capture(lambda: seen.append(capturing()))
    assert seen == [True] and not capturing()


def recorded(snaps=None, attrs=None, after=True):
    def body(tape):
        k = tape.before("verify", snaps if snaps is not None else {"x": torch.zeros(2)}, attrs)
        if after:
            tape.after(k, {})
    return body


@pytest.mark.parametrize("body, reason", [
    (recorded({"x": [1.0, 2.0]}), "verify before x: a list, not a tensor"),
    (recorded({"x": (torch.zeros(2), 3)}), "a tuple, not a tensor or a"),
    (recorded({"x": torch.zeros(2, device="meta")}), "a tensor on meta, the graph is on cpu"),
    (recorded({"rows": (torch.zeros(4, 2), torch.zeros(2, dtype=torch.int32, device="meta"))}), "on meta"),
    (recorded({"rows": (torch.zeros(4, 2), torch.zeros(2))}), "index of torch.float32, not an integer"),
    (recorded({"rows": (torch.zeros(0, 2), torch.zeros(2, dtype=torch.int64))}), "a buffer without rows"),
    (recorded(attrs={"lens": torch.ones(2)}), "attrs lens are not host scalars"),
    (recorded(after=False), "verify has no after snapshot"),
])
def test_a_call_the_tape_cannot_resolve_fails_its_graph(body, reason):
    with fake_hooks() as hooks:
        tape = GraphTape(hooks)
        graph = FakeGraph()
        raised = []

        def captured():
            try:
                body(tape)
            except GraphRecordError as exc:
                raised.append(str(exc))

        graph.capture(captured)
        with pytest.raises(GraphRecordError, match=reason) as read:
            tape.read(graph)
        assert raised == ([] if reason.endswith("no after snapshot") else [str(read.value)])


def test_captures_the_hooks_cannot_follow():
    reads: list = []

    def on_replay(graph):
        try:
            reads.append(tape.read(graph))
        except GraphRecordError as exc:
            reads.append(str(exc))

    early = FakeGraph()
    early.capture(lambda: None)
    with fake_hooks(on_replay) as hooks:
        tape = GraphTape(hooks)
        early.replay()
        twice, other, unfinished = FakeGraph(), FakeGraph(), FakeGraph()
        twice.capture_begin()
        twice.capture_begin()
        twice.capture_end()
        other.capture_begin()
        with pytest.raises(GraphRecordError, match="two graphs captured at once"):
            FakeGraph().capture(lambda: tape.before("verify", {}))
        other.capture_end()
        unfinished.capture_begin()
        for graph, reason in ((twice, "capture_begin on a graph already being captured"),
                              (other, "two graphs captured at once"), (unfinished, "did not see complete")):
            with pytest.raises(GraphRecordError, match=reason):
                tape.read(graph)
        twice.capture_end()  # the fakes' captures left open
        unfinished.capture_end()
    assert not is_capturing()
    assert reads == ["a graph replayed whose capture the graph hooks did not see (captured before they were "
                     "installed)"]


def test_hooks_installed_again_forget_the_graphs_they_saw():
    with fake_hooks() as hooks:
        tape = GraphTape(hooks)
        graph = FakeGraph()
        graph.capture(lambda: tape.after(tape.before("verify", {}), {}))
        assert [c.name for c in tape.read(graph)] == ["verify"]
        hooks.uninstall()
        hooks.install()  # the graph may have been captured anew in between, unseen
        with pytest.raises(GraphRecordError, match="did not see"):
            tape.read(graph)


def test_a_replay_that_runs_other_calls_than_its_capture_fails():
    with fake_hooks() as hooks:
        tape = GraphTape(hooks)
        names = iter(["verify", "commit"])
        graph = FakeGraph()
        graph.capture(lambda: tape.after(tape.before(next(names), {"x": torch.zeros(1)}), {}))
        with pytest.raises(GraphRecordError, match="a replay ran commit as call 0"):
            graph.replay()
        with pytest.raises(GraphRecordError, match="a replay ran commit"):
            tape.read(graph)


class Untaped:
    """A tape's stand-in for a warm-up run outside any capture: it copies nothing."""

    def before(self, name, snaps, attrs=None) -> int:
        return 0

    def after(self, position, snaps) -> None:
        pass


@pytest.mark.gpu_only
def test_cuda_graph_replays_copy_what_each_replay_saw():
    device = torch.device("cuda", torch.cuda.current_device())
    reads: list = []
    with GraphHooks(lambda g: reads.append(tape.read(g))) as hooks:
        tape = GraphTape(hooks)
        step, graph = Step(Untaped(), device), torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up on the capturing stream: the step's kernels and the tape's
            step()
            clamped = step.idx.to(torch.int64).clamp_(0, ROWS - 1)
            torch.index_select(step.pool, 0, clamped, out=torch.empty(3, WIDTH, device=device))
        torch.cuda.current_stream().wait_stream(stream)
        step.tape = tape
        with torch.cuda.graph(graph, stream=stream):
            step()
        assert hooks.capturing_graph() is None
        assert tape.bytes_held(graph) == step.bytes()
        check_replays(reads, replay_twice(graph, step, reads))
