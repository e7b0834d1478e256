"""The recorder: a live decode loop recorded and replayed bit for bit, environment-variable
activation, crash safety, caps, filters and snapshots."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import traces.record.recorder as record
from tests.support.decode_loop import decode_loop
from tests.support.trace_helpers import run_kda
from traces.format.io import read_trace
from traces.record.recorder import RecordError, Recorder, record_trace, shards_dir
from traces.format.tape import Tape

REPO = Path(__file__).resolve().parents[3]


def _ops(path: Path) -> list[str]:
    with read_trace(path) as trace:
        return [e.op for e in trace.events]


DEFERRED_OPS = ["flush"] + ["verify", "plan", "defer", "commit", "flush"] * 3


def test_recorded_decode_loop_replays_bit_identically(tmp_path, capsys, monkeypatch, device):
    path = tmp_path / "live.safetensors"
    with record_trace(path, "kernels") as api:
        decode_loop(api, "deferred", steps=3, device=device)
    assert not shards_dir(path).exists()
    assert _ops(path) == DEFERRED_OPS
    code, out, err = run_kda(["replay", str(path), "--impl", "triton", "--atol", "0", "--rtol", "0",
                              "--format", "json", "--no-progress"], capsys, monkeypatch)
    assert code == 0, err
    report = json.loads(out)
    compared = [t for e in report["events"] for t in e["tensors"]]
    assert len(compared) >= 30
    assert all(t["max_abs"] == 0 and t["mismatches"] == 0 for t in compared)


def test_fused_calls_are_recorded_as_the_ops_they_stand_for(tmp_path, capsys, monkeypatch, device):
    """``kda_recoverssm_flush_verify`` as a flush then a verify, ``kda_recoverssm_plan_deferred``
    as a plan then a defer: the same events as the unfused loop, and they replay."""
    path = tmp_path / "fused.safetensors"
    with record_trace(path, "kernels") as api:
        decode_loop(api, "deferred", steps=3, fused=True, device=device)
    assert _ops(path) == DEFERRED_OPS
    code, out, err = run_kda(["replay", str(path), "--impl", "reference", "--format", "json", "--no-progress"],
                             capsys, monkeypatch)
    assert code == 0, err
    assert json.loads(out)["passed"] is True


def test_trace_carries_inputs_results_and_provenance(tmp_path):
    path = tmp_path / "live.safetensors"
    with record_trace(path, "reference") as api:
        decode_loop(api, "deferred", steps=2)
    with read_trace(path) as trace:
        m = trace.manifest
        assert (m.dims.H, m.dims.K, m.dims.V, m.dims.T) == (2, 16, 16, 4)
        assert (m.activation_dtype, m.state_dtype, m.lower_bound) == ("bfloat16", "float32", -5.0)
        assert m.provenance["producer"] == "kda record" and m.provenance["impl"] == "reference"
        assert {"versions", "gpu", "command", "pid"} <= set(m.provenance)
        verify = m.events[1]
        assert set(verify.inputs) == {"q", "k", "v", "raw_g", "raw_beta", "query_start_loc", "state_indices",
                                      "record_indices"}
        assert set(verify.expected) == {"out", "records.correction", "records.key_gate"}
        assert set(m.events[4].expected) == {"slots", "states"}
        assert trace.tensor(verify.inputs["state_indices"]).tolist() == [1, 2, 3, -1]
        pool = trace.tensor(m.initial["checkpoint_state"])
    g = torch.Generator().manual_seed(0)
    live = torch.randn(4, 2, 16, 16, generator=g) * 0.5  # what decode_loop drew first
    assert torch.equal(pool[1:], live[1:]) and not pool[0].any()


def test_snapshot_touched_leaves_unseen_slots_zero_and_all_copies_pools(tmp_path):
    def loop(api, pool):
        records = api.allocate_records(2, 1, 4, 16, 16, torch.bfloat16, "cpu")
        A_log, dt_bias = torch.zeros(1), torch.zeros(16)
        q = torch.randn(1, 4, 1, 16).to(torch.bfloat16)
        api.kda_recoverssm_verify(q, q, q, q, q[..., 0].contiguous(), A_log, dt_bias, -5.0, pool, records,
                                  torch.tensor([0, 4], dtype=torch.int32), torch.tensor([2], dtype=torch.int32), 4)

    pool = torch.randn(5, 1, 16, 16)
    for mode in ("touched", "all"):
        path = tmp_path / f"{mode}.safetensors"
        with record_trace(path, "reference", snapshot=mode) as api:
            loop(api, pool)
        with read_trace(path) as trace:
            initial = trace.tensor(trace.manifest.initial["checkpoint_state"])
        if mode == "all":
            assert torch.equal(initial, pool)
        else:
            assert torch.equal(initial[2], pool[2]) and not initial[[0, 1, 3, 4]].any()


def test_caps_filter_and_foreign_buffers(tmp_path, capsys, monkeypatch):
    path = tmp_path / "capped.safetensors"
    with record_trace(path, "reference", max_events=4) as api:
        decode_loop(api, "deferred", steps=2)
    assert _ops(path) == DEFERRED_OPS[:4]
    with read_trace(path) as trace:
        assert trace.manifest.provenance["stopped_by"] == "max_events"

    path = tmp_path / "filtered.safetensors"
    with record_trace(path, "reference", ops=["verify", "commit"]) as api:
        decode_loop(api, "deferred", steps=2)
        decode_loop(api, "deferred", steps=1, seed=1)  # another pool: passed through, not recorded
    assert [op for op in _ops(path) if op != "write"] == ["verify", "commit"] * 2
    assert "write" in _ops(path)  # what the skipped flushes, plans and defers changed
    with read_trace(path) as trace:
        skipped = trace.manifest.provenance["skipped_calls"]
    assert skipped == {"flush": 5, "plan": 3, "defer": 3, "verify": 1, "commit": 1}
    code, out, err = run_kda(["replay", str(path), "--impl", "reference", "--atol", "0", "--rtol", "0",
                              "--no-progress"], capsys, monkeypatch)
    assert code == 0, out + err


def test_byte_cap_and_a_call_that_raises(tmp_path, capsys, monkeypatch, device):
    path = tmp_path / "small.safetensors"
    with record_trace(path, "reference", max_bytes=20_000) as api:
        decode_loop(api, "deferred", steps=3)
    with read_trace(path) as trace:
        assert 1 <= len(trace.events) < len(DEFERRED_OPS)
        assert trace.manifest.provenance["stopped_by"] == "max_bytes"
    path = tmp_path / "one.safetensors"  # the event that crosses the cap is recorded whole, the others counted
    with record_trace(path, "reference", max_bytes=1) as api:
        decode_loop(api, "deferred", steps=3)
    with read_trace(path) as trace:
        assert [e.op for e in trace.events] == DEFERRED_OPS[:1] and trace.events[0].expected
        assert sum(trace.manifest.provenance["skipped_calls"].values()) == len(DEFERRED_OPS) - 1

    path = tmp_path / "raised.safetensors"
    with record_trace(path, "reference") as api:
        pool = torch.zeros(4, 2, 16, 16)
        records = api.allocate_records(4, 2, 4, 16, 16, torch.bfloat16, "cpu")
        x = torch.zeros(1, 4, 2, 16, dtype=torch.bfloat16)
        with pytest.raises(ValueError):  # raw_beta has the wrong shape
            api.kda_recoverssm_verify(x, x, x, x, x, torch.zeros(2), torch.zeros(32), -5.0, pool, records,
                                      torch.tensor([0, 4], dtype=torch.int32), torch.tensor([1], dtype=torch.int32), 4)
        decode_loop(api, "deferred", steps=2, device=device)  # replayed bit for bit below: on its device
    with read_trace(path) as trace:
        assert trace.manifest.provenance["skipped_calls"] == {"raised": 1}
        assert len(trace.events) == 11
    code, out, err = run_kda(["replay", str(path), "--impl", "reference", "--atol", "0", "--rtol", "0",
                              "--no-progress"], capsys, monkeypatch)
    assert code == 0, out + err


def test_bad_options_and_leftover_shards_are_refused(tmp_path):
    with pytest.raises(RecordError, match="snapshot"):
        Recorder(tmp_path / "a.safetensors", "reference", snapshot="some")
    with pytest.raises(RecordError, match="ops"):
        Recorder(tmp_path / "a.safetensors", "reference", ops=["prefill"])
    shards_dir(tmp_path / "b.safetensors").mkdir()
    with pytest.raises(RecordError, match="a recording that never finished: kda record merge .* keeps its events"):
        Recorder(tmp_path / "b.safetensors", "reference")


def test_record_run_names_a_stale_shards_folder_and_what_to_do(tmp_path, capsys, monkeypatch):
    path = tmp_path / "b.safetensors"
    shards_dir(path).mkdir()
    code, out, err = run_kda(["record", "run", str(path), "--", sys.executable, "-c", "pass"], capsys, monkeypatch)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [f"Error: {shards_dir(path)} holds the shards of a recording that never "
                                        f"finished: kda record merge {shards_dir(path)} TRACE keeps its events; "
                                        "remove the folder to discard them"]


def test_environment_variable_turns_the_hook_into_a_recorder(tmp_path, monkeypatch):
    import kernels.reference

    monkeypatch.delenv("KDA_RECORD", raising=False)
    assert record.api("reference") is kernels.reference
    path = tmp_path / "env.safetensors"
    monkeypatch.setenv("KDA_RECORD", str(path))
    monkeypatch.setenv("KDA_RECORD_OPS", "verify,plan")
    monkeypatch.setattr(record, "_process_recorder", None)
    api = record.api("reference")
    assert isinstance(api, Recorder) and record.api("reference") is api
    decode_loop(api, "deferred", steps=1)
    api.close()
    assert _ops(path) == ["verify", "plan"]


_DYING_PROGRAM = """
import os, sys
sys.path.insert(0, {repo!r})
import kernels.reference as ref
from kernels.reference import *  # noqa
calls = 0

def kda_recoverssm_commit(*args, **kwargs):
    global calls
    calls += 1
    if calls == 2:
        {death}  # the process dies inside the call
    return ref.kda_recoverssm_commit(*args, **kwargs)
"""


def _program(tmp_path: Path, device: str, death: str = "os._exit(7)") -> Path:
    """A decode loop recorded through ``traces.record.api`` on ``device`` (the one kda replays on);
    ``dying_impl.py`` beside it runs ``death`` in its second commit."""
    (tmp_path / "dying_impl.py").write_text(_DYING_PROGRAM.format(repo=str(REPO), death=death))
    main = tmp_path / "main.py"
    main.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from tests.support.decode_loop import decode_loop
        from traces.record import api
        decode_loop(api("reference"), "deferred", steps=3, device={device!r})
    """))
    return main


def test_a_process_that_dies_mid_call_leaves_a_mergeable_trace(tmp_path, capsys, monkeypatch, device):
    path = tmp_path / "crash.safetensors"
    env = dict(os.environ, KDA_RECORD=str(path), KDA_RECORD_IMPL=str(tmp_path / "dying_impl.py"),
               TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, str(_program(tmp_path, device))], env=env, capture_output=True, text=True)
    assert done.returncode == 7 and not path.exists()
    code, out, err = run_kda(["record", "merge", str(shards_dir(path)), str(path), "--format", "json"],
                             capsys, monkeypatch)
    assert code == 0, err
    merged = json.loads(out)
    assert merged["events"] == 10 and merged["incomplete_event"] == 9  # the second commit never returned
    assert _ops(path) == DEFERRED_OPS[:10]
    with read_trace(path) as trace:
        assert trace.events[9].expected == {} and trace.events[8].expected
    code, out, err = run_kda(["replay", str(path), "--impl", "reference", "--atol", "0", "--rtol", "0",
                              "--no-progress"], capsys, monkeypatch)
    assert code == 0, out + err


def test_record_run_records_a_program(tmp_path, capsys, monkeypatch, device):
    main = _program(tmp_path, device)
    path = tmp_path / "run.safetensors"
    code, out, err = run_kda(["record", "run", str(path), "--ops", "verify", "--", sys.executable, str(main)],
                             capsys, monkeypatch)
    assert code == 0, err
    assert [op for op in _ops(path) if op != "write"] == ["verify"] * 3
    with read_trace(path) as trace:
        assert Tape.load(trace).provenance["command"].endswith("main.py")


def test_a_program_killed_by_a_signal_is_named_merged_and_its_shards_removed(tmp_path, capsys, monkeypatch, device):
    main = _program(tmp_path, device, death="os.kill(os.getpid(), 9)")
    path = tmp_path / "killed.safetensors"
    command = ["record", "run", str(path), "--impl", str(tmp_path / "dying_impl.py"), "--", sys.executable, str(main)]
    code, out, err = run_kda(command, capsys, monkeypatch)
    assert code == 3
    assert err.strip().splitlines()[-1] == "Error: the command was killed by SIGKILL"
    assert out.startswith(f"wrote {path}: 10 events; event 9 never returned") and "killed by SIGKILL" in out
    assert _ops(path) == DEFERRED_OPS[:10]
    assert not shards_dir(path).exists()  # merged, so gone: the same command can run again
    code, out, err = run_kda([*command[:3], "--force", *command[3:]], capsys, monkeypatch)
    assert code == 3 and out.startswith(f"wrote {path}: 10 events"), err
    assert not shards_dir(path).exists()
