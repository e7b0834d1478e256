"""Malformed traces: each gives exit code 2 and one ``Error:`` line naming event and tensor,
with no traceback, before any kernel runs."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.support.trace_helpers import load_raw, make_trace, rewrite, run_kda
from traces.format.io import read_trace
from traces.format.schema import METADATA_KEY, TraceError


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return make_trace(tmp_path_factory.mktemp("valid") / "good.safetensors")


def _event_tensor(m: dict, op: str, section: str, role: str) -> tuple[int, str]:
    for i, e in enumerate(m["events"]):
        if e["op"] == op and role in e[section]:
            return i, e[section][role]
    raise LookupError(role)


def _set(op: str, section: str, role: str, change):
    """An edit that replaces an event tensor by ``change(tensor)``."""
    def edit(m, t):
        _, name = _event_tensor(m, op, section, role)
        t[name] = change(t[name])
    return edit


def _drop_tensor(m, t):
    _, name = _event_tensor(m, "verify", "inputs", "raw_beta")
    del t[name]


def _slot_out_of_range(m, t):
    _, name = _event_tensor(m, "verify", "inputs", "state_indices")
    t[name] = t[name].clone()
    t[name][0] = m["buffers"]["num_slots"]


def _record_row_out_of_range(m, t):
    _, name = _event_tensor(m, "defer", "inputs", "record_rows")
    t[name] = t[name].clone()
    t[name][-1] = m["buffers"]["num_record_rows"] + 3


def _qsl_not_monotone(m, t):
    _, name = _event_tensor(m, "verify", "inputs", "query_start_loc")
    q = t[name].clone()
    q[1] = q[2] + 1
    t[name] = q


def _too_many_tokens(m, t):
    """Row 0 claims T + 1 tokens: the event's token tensors grow to match."""
    i, name = _event_tensor(m, "verify", "inputs", "query_start_loc")
    T = m["dims"]["T"]
    q = t[name].clone()
    extra = T + 1 - int(q[1] - q[0])
    q[1:] += extra
    t[name] = q
    for role in ("q", "k", "v", "raw_g", "raw_beta"):
        x = t[m["events"][i]["inputs"][role]]
        t[m["events"][i]["inputs"][role]] = torch.cat([x, x[:, :extra]], dim=1)
    for role, n in list(m["events"][i]["expected"].items()):
        if role == "out":
            t[n] = torch.cat([t[n], t[n][:, :extra]], dim=1)


def _nan_index(m, t):
    _, name = _event_tensor(m, "verify", "inputs", "state_indices")
    x = t[name].to(torch.float32)
    x[0] = float("nan")
    t[name] = x


def _version(m, t):
    m["version"] = 3


CASES = {
    "wrong version": (_version, ["format version 3 is not supported"]),
    "missing tensor": (_drop_tensor, ["event 0 (verify)", "raw_beta", "missing from the file"]),
    "wrong dtype": (_set("verify", "inputs", "q", lambda x: x.float()),
                    ["event 0 (verify)", "(q)", "dtype float32, expected bfloat16"]),
    "wrong shape": (_set("verify", "inputs", "v", lambda x: x[..., :-1]), ["event 0 (verify)", "(v)", "shape"]),
    "wrong index dtype": (_set("plan", "inputs", "num_accepted", lambda x: x.long()),
                          ["event 1 (plan)", "num_accepted", "dtype int64, expected int32"]),
    "slot out of range": (_slot_out_of_range, ["event 0 (verify)", "state_indices", "slot 6", "out of range"]),
    "record row out of range": (_record_row_out_of_range, ["(defer)", "record_rows", "record row 7", "out of range"]),
    "qsl not monotone": (_qsl_not_monotone, ["event 0 (verify)", "query_start_loc", "not monotone"]),
    "more than T tokens": (_too_many_tokens, ["event 0 (verify)", "query_start_loc", "more than T = 4"]),
    "NaN in an index tensor": (_nan_index, ["event 0 (verify)", "state_indices", "expected int32", "NaN"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_trace_exits_2_with_one_error_line(case, good, tmp_path, capsys, monkeypatch):
    edit, fragments = CASES[case]
    bad = rewrite(good, tmp_path / "bad.safetensors", edit)
    code, out, err = run_kda(["replay", str(bad), "--impl", "reference", "--no-progress"], capsys, monkeypatch)
    assert code == 2, err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert "Traceback" not in err


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case, make, fragment", [
    ("missing file", lambda p, good: p / "nope.safetensors", "no such file"),
    ("empty", lambda p, good: _write(p / "empty.safetensors", b""), "empty file"),
    ("not safetensors", lambda p, good: _write(p / "text.safetensors", b"this is not a trace at all"),
     "not a readable safetensors file"),
    ("truncated", lambda p, good: _write(p / "cut.safetensors", good.read_bytes()[:50_000]),
     "truncated: 50000 bytes, where its safetensors header describes "),
    ("truncated in its header", lambda p, good: _write(p / "cut.safetensors", good.read_bytes()[:100]),
     "truncated: 100 bytes, where its safetensors header describes "),
])
def test_unreadable_file_exits_2(case, make, fragment, good, tmp_path, capsys, monkeypatch):
    path = make(tmp_path, good)
    for command in (["replay", str(path), "--impl", "reference"], ["info", str(path)]):
        code, out, err = run_kda(command, capsys, monkeypatch)
        assert code == 2 and out == ""
        assert err.startswith("Error: ") and fragment in err and "Traceback" not in err


def test_safetensors_without_manifest_is_refused(tmp_path):
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(TraceError, match="not a kda trace"):
        read_trace(tmp_path / "plain.safetensors")


def test_out_of_range_slot_never_reaches_a_kernel(good, tmp_path, monkeypatch):
    """Validation is complete at open: the bad slot sits in the last verify, yet nothing runs."""
    manifest, _ = load_raw(good)
    last = max(i for i, e in enumerate(manifest["events"]) if e["op"] == "verify")

    def edit(m, t):
        name = m["events"][last]["inputs"]["state_indices"]
        t[name] = t[name].clone()
        t[name][0] = 1000
    bad = rewrite(good, tmp_path / "late.safetensors", edit)
    with pytest.raises(TraceError, match=f"event {last} \\(verify\\).*slot 1000"):
        read_trace(bad)


def test_index_in_expected_slots_must_be_real(good, tmp_path):
    manifest, tensors = load_raw(good)
    i = next(i for i, e in enumerate(manifest["events"])
             if "slots" in e["expected"] and tensors[e["expected"]["slots"]].numel())

    def edit(m, t):
        name = m["events"][i]["expected"]["slots"]
        t[name] = torch.zeros_like(t[name])
    with pytest.raises(TraceError, match=f"event {i} .*slots.*written slot 0"):
        read_trace(rewrite(good, tmp_path / "s.safetensors", edit))


def test_end_to_end_no_traceback_in_a_real_process(tmp_path):
    """The installed entry point, in its own process: bad input is one line, exit 2."""
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    proc = subprocess.run([sys.executable, "-m", "kda_cli", "replay", str(bad)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.startswith("Error: ") and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_manifest_json_damage_is_reported(good, tmp_path):
    from safetensors.torch import save_file

    _, tensors = load_raw(good)
    save_file(tensors, str(tmp_path / "j.safetensors"), metadata={METADATA_KEY: "{not json"})
    with pytest.raises(TraceError, match="not valid JSON"):
        read_trace(tmp_path / "j.safetensors")
