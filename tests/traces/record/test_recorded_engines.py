"""A correct engine's recording always replays: random schedules of an engine that writes its
buffers between the recorded calls (``tests.support.random_engine``), recorded whole, with an
``--ops`` filter and with a cap, replay with exit 0 through kda's kernels and the
reference, bit for bit through the implementation that recorded them."""

import random

import pytest
import torch

from tests.support.random_engine import run_engine
from tests.support.seeds import fresh_seed
from tests.support.trace_helpers import run_kda
from traces.format.io import read_trace
from traces.record.recorder import record_trace
from traces.record.watch import fingerprint

FILTERS = (None, ["verify", "commit"], ["commit", "flush"], ["verify", "plan", "defer"], ["flush"])


def _replay(path, impl: str, capsys, monkeypatch, exact: bool = False) -> tuple[int, str]:
    args = ["replay", str(path), "--impl", impl, "--no-progress"]
    if exact:
        args += ["--atol", "0", "--rtol", "0"]
    code, out, err = run_kda(args, capsys, monkeypatch)
    return code, out + err


@pytest.mark.parametrize("case", range(4))
def test_random_engine_schedules_replay_exactly(case, tmp_path, capsys, monkeypatch):
    seed = fresh_seed()
    rng = random.Random(seed)
    ops = FILTERS[case] if case else None
    cap = rng.choice([None, rng.randint(4, 12)]) if case == 0 else None
    consume = rng.random() < 0.5
    snapshot = "all" if case == 2 else "touched"
    path = tmp_path / "engine.safetensors"
    with record_trace(path, "reference", ops=ops, max_events=cap, snapshot=snapshot) as api:
        run_engine(api, seed, consume_pending=consume)
    with read_trace(path) as trace:
        ops_seen = [e.op for e in trace.events]
    what = f"engine seed {seed}, ops {ops}, cap {cap}, snapshot {snapshot}, consume_pending {consume}: {ops_seen}"
    code, report = _replay(path, "reference", capsys, monkeypatch, exact=True)
    assert code == 0, f"{what}\n{report}"
    code, report = _replay(path, "triton", capsys, monkeypatch)
    assert code == 0, f"{what}\n{report}"


def test_writes_between_calls_are_recorded(tmp_path, capsys, monkeypatch):
    """The engine's own writes become write events; without them the same trace fails."""
    seed = fresh_seed()
    path = tmp_path / "engine.safetensors"
    with record_trace(path, "reference") as api:
        run_engine(api, seed, steps=8)
    with read_trace(path) as trace:
        writes = [i for i, e in enumerate(trace.events) if e.op == "write"]
        roles = {role for i in writes for role in trace.events[i].inputs}
    assert writes, f"engine seed {seed}: no write recorded"
    assert roles & {"slots", "pending", "rows"}

    from tests.support.trace_helpers import rewrite

    def drop_writes(manifest, tensors):
        for e in manifest["events"]:
            if e["op"] == "write":
                for name in e["inputs"].values():
                    del tensors[name]
        manifest["events"] = [e for e in manifest["events"] if e["op"] != "write"]

    stripped = rewrite(path, tmp_path / "stripped.safetensors", drop_writes)
    code, report = _replay(stripped, "reference", capsys, monkeypatch, exact=True)
    assert code == 1, f"engine seed {seed}: the trace replays without its writes\n{report}"


def test_recorded_through_triton_replays_bit_for_bit(tmp_path, capsys, monkeypatch):
    seed = fresh_seed()
    path = tmp_path / "engine.safetensors"
    with record_trace(path, "triton") as api:
        run_engine(api, seed, steps=4, consume_pending=False)
    code, report = _replay(path, "triton", capsys, monkeypatch, exact=True)
    assert code == 0, f"engine seed {seed}\n{report}"


def test_fingerprint_sees_every_single_word_change():
    """A change of any one word (a NaN payload, a sign bit, a bf16 half-word) changes the
    row's fingerprint and no other row's."""
    gen = torch.Generator().manual_seed(fresh_seed())
    for dtype, shape in ((torch.float32, (3, 2, 5, 7)), (torch.bfloat16, (3, 2, 3, 3)), (torch.int32, (4, 9))):
        rows = torch.randn(shape, generator=gen).to(dtype) if dtype.is_floating_point else \
            torch.randint(-9, 9, shape, generator=gen, dtype=dtype)
        before = fingerprint(rows)
        flat = rows.reshape(rows.shape[0], -1)
        bits = flat.view(torch.int16 if dtype == torch.bfloat16 else torch.int32)
        for row, col, flip in ((1, 0, 1), (2, flat.shape[1] - 1, -2**14), (0, 3, 1 << 13)):
            changed = flat.clone()
            changed.view(bits.dtype)[row, col] ^= flip
            after = fingerprint(changed.reshape(shape))
            assert after[row] != before[row], (dtype, row, col)
            assert torch.equal(torch.cat([after[:row], after[row + 1:]]), torch.cat([before[:row], before[row + 1:]]))
