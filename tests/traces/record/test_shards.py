"""Recording shards that a crash (or a disk) damaged: ``kda record merge`` keeps every intact
event before the damage and says what it dropped and why; a malformed shard is exit 2
with one line, found before anything is allocated from its claims."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.support.decode_loop import decode_loop
from tests.support.trace_helpers import run_kda
from traces.format.io import read_trace
from traces.record.recorder import Recorder
from traces.record.shards import load_shard, save_shard

EVENTS = 16  # flush, then verify, plan, defer, commit, flush three times


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """The shards of a three-step deferred decode loop, never merged."""
    rec = Recorder(tmp_path_factory.mktemp("shards") / "loop.safetensors", "reference")
    decode_loop(rec, "deferred", steps=3)
    assert rec.events == EVENTS
    return rec.shards


@pytest.fixture
def shards(recorded, tmp_path) -> Path:
    return Path(shutil.copytree(recorded, tmp_path / "loop.safetensors.shards"))


def _flip(path: Path, from_end: int) -> None:
    """Flip the exponent byte of a float near the end of the file (in the tensor data)."""
    data = bytearray(path.read_bytes())
    data[-from_end] ^= 0x40
    path.write_bytes(bytes(data))


def _merge(shards: Path, capsys, monkeypatch) -> tuple[int, dict | str, str]:
    code, out, err = run_kda(["record", "merge", str(shards), str(shards.parent / "merged.safetensors"),
                              "--format", "json"], capsys, monkeypatch)
    return code, json.loads(out) if code == 0 else out, err


def _one_error_line(code: int, err: str) -> str:
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("Error: "), (code, err)
    assert "Traceback" not in err
    return lines[0]


def test_intact_shards_merge_whole(shards, capsys, monkeypatch):
    code, merged, err = _merge(shards, capsys, monkeypatch)
    assert code == 0, err
    assert merged["events"] == EVENTS and merged["dropped_shards"] == 0 and merged["dropped_because"] is None


@pytest.mark.parametrize("index,kind", [(EVENTS - 1, "out"), (11, "in"), (5, "out")])
def test_a_flipped_byte_ends_the_merge_at_that_event(shards, capsys, monkeypatch, index, kind):
    _flip(shards / f"{index:06d}.{kind}.safetensors", 3)
    code, merged, err = _merge(shards, capsys, monkeypatch)
    assert code == 0, err
    assert merged["events"] == index and merged["dropped_shards"] == EVENTS - index
    assert merged["dropped_because"].startswith(f"{index:06d}.{kind}.safetensors: checksum mismatch")
    with read_trace(merged["path"]) as trace:
        assert len(trace.events) == index and all(e.expected for e in trace.events)


def test_a_damaged_header_is_damage_too(shards, capsys, monkeypatch):
    path = shards / "000007.in.safetensors"
    data = bytearray(path.read_bytes())
    data[12] ^= 0x01
    path.write_bytes(bytes(data))
    code, merged, err = _merge(shards, capsys, monkeypatch)
    assert code == 0, err
    assert merged["events"] == 7 and merged["dropped_because"].startswith("000007.in.safetensors: ")


def _rewrite_last(shards: Path, edit) -> None:
    """Rewrite the last input shard through ``edit(meta, tensors)``, with fresh checksums (intact, but malformed)."""
    path = shards / f"{EVENTS - 1:06d}.in.safetensors"
    meta, tensors = load_shard(path)
    edit(meta, tensors)
    save_shard(path, tensors, meta)


@pytest.mark.parametrize("key", ["num_slots", "state_dtype", "lower_bound", "provenance", "max_batch"])
def test_a_context_without_a_key_is_one_error_line(shards, capsys, monkeypatch, key):
    _rewrite_last(shards, lambda meta, t: meta["context"].pop(key))
    code, out, err = _merge(shards, capsys, monkeypatch)
    line = _one_error_line(code, err)
    assert f"{EVENTS - 1:06d}.in.safetensors" in line and key in line, line


@pytest.mark.parametrize("dims,num_slots", [({"H": 16, "K": 128, "V": 128, "T": 4}, 3000),
                                            ({"H": 2, "K": 16, "V": 16, "T": 4}, 2**31 - 1),
                                            ({"H": 2, "K": 16, "V": 2**20, "T": 4}, 7)])
def test_claimed_dims_are_checked_against_the_tensors_before_allocation(shards, capsys, monkeypatch, dims,
                                                                        num_slots):
    def claim(meta, tensors):
        meta["context"].update(dims=dims, num_slots=num_slots)
    _rewrite_last(shards, claim)
    code, out, err = _merge(shards, capsys, monkeypatch)
    line = _one_error_line(code, err)
    assert "claim" in line, line


def test_a_planted_snapshot_slot_is_refused(shards, capsys, monkeypatch):
    def plant(meta, tensors):
        tensors["snap.slots"] = torch.tensor([meta["context"]["num_slots"]], dtype=torch.int32)
        tensors["snap.states"] = torch.zeros(1, 2, 16, 16)
    _rewrite_last(shards, plant)
    code, out, err = _merge(shards, capsys, monkeypatch)
    assert "snap.slots" in _one_error_line(code, err)


def test_a_dtype_letter_flipped_in_the_header_is_damage(shards, capsys, monkeypatch):
    """``I32`` to ``F32`` keeps every byte of the data: the checksum covers dtype and shape too."""
    index = 5
    path = shards / f"{index:06d}.in.safetensors"
    data = path.read_bytes()
    assert b'"dtype":"I32"' in data
    path.write_bytes(data.replace(b'"dtype":"I32"', b'"dtype":"F32"', 1))
    code, merged, err = _merge(shards, capsys, monkeypatch)
    assert code == 0, err
    assert merged["events"] == index
    assert merged["dropped_because"].startswith(f"{index:06d}.in.safetensors: checksum mismatch")


@pytest.mark.parametrize("drop", ["snap.states", "snap.rows", "snap.records.key_gate"])
def test_a_snapshot_without_its_index_or_contents_is_refused(shards, capsys, monkeypatch, drop):
    index = next(i for i in range(EVENTS) if drop in load_shard(shards / f"{i:06d}.in.safetensors")[1])
    path = shards / f"{index:06d}.in.safetensors"
    meta, tensors = load_shard(path)
    del tensors[drop]
    save_shard(path, tensors, meta)
    code, out, err = _merge(shards, capsys, monkeypatch)
    assert "come together" in _one_error_line(code, err)


def test_a_lone_event_that_never_returned_and_does_not_validate_is_one_error_line(shards, capsys, monkeypatch):
    """Only the first event's inputs, no results, and a slot out of range: no trace can be
    made, which is said in one line (exit 2), not an index error."""
    for path in shards.iterdir():
        if path.name != "000000.in.safetensors":
            path.unlink()
    meta, tensors = load_shard(shards / "000000.in.safetensors")
    tensors["in.state_indices"] = torch.full_like(tensors["in.state_indices"], 10**6)
    save_shard(shards / "000000.in.safetensors", tensors, meta)
    code, out, err = _merge(shards, capsys, monkeypatch)
    line = _one_error_line(code, err)
    assert "no event makes a trace: event 0 never returned and its inputs do not validate" in line, line
    assert "slot 1000000" in line and not (shards.parent / "merged.safetensors").exists()


def _layers_claim(layers: int, conv: dict | None = None):
    def claim(meta, tensors):
        meta["context"]["layers"] = layers
        if conv is not None:
            meta["context"]["conv"] = conv
    return claim


CONV = {"layout": "dim_first", "dim": 8, "width": 3}


@pytest.mark.parametrize("edit, message", [
    (lambda meta, t: meta["attrs"].update(layer=1), "attrs.layer 1 is not a layer of its context"),
    (lambda meta, t: meta["context"].update(layers=0), "context layers 0 is not a positive count"),
    (lambda meta, t: meta["context"].update(conv={**CONV, "width": 1}), "context conv"),
    (lambda meta, t: (_layers_claim(2)(meta, t), t.update({"layers.5.snap.A_log": torch.zeros(2)})),
     "snapshots of layer 5, the shards claim 2 layer(s)"),
    (lambda meta, t: t.update({"layers.x.snap.A_log": torch.zeros(2)}), "tensor 'layers.x.snap.A_log' names no layer"),
    (lambda meta, t: t.update({"snap.conv_slots": torch.tensor([1]), "snap.conv_states": torch.zeros(1, 8, 5)}),
     "conv state snapshots, the shards claim no conv state"),
    (lambda meta, t: (_layers_claim(1, CONV)(meta, t),
                      t.update({"snap.conv_slots": torch.tensor([1]), "snap.conv_states": torch.zeros(1, 8, 4)})),
     "tensor 'snap.conv_states' has shape [1, 8, 4], the shards claim [1, 8, 5]"),
    (lambda meta, t: (_layers_claim(1, CONV)(meta, t), t.update({"snap.conv_slots": torch.tensor([1])})),
     "snap.conv_slots and snap.conv_states come together"),
])
def test_hostile_layer_and_conv_claims_are_one_error_line(shards, capsys, monkeypatch, edit, message):
    """The v2 parts of a shard (an event's layer, snapshots of another layer, the conv state)
    are checked like the rest, before anything is allocated."""
    _rewrite_last(shards, edit)
    code, out, err = _merge(shards, capsys, monkeypatch)
    assert message in _one_error_line(code, err)
