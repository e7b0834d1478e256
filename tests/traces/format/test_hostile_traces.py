"""Hostile traces: files built to push an index past a buffer, or to break the reader.

Each is refused with exit 2 and one ``Error:`` line before any kernel call (a spy
implementation in front of the reference records every call), and no control character
from the file reaches the terminal.
"""

from __future__ import annotations

import json
import re
import struct
import sys
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import kernels
import kernels.reference as ref
from kernels import CommitPlan
from tests.support.trace_helpers import INT32_MAX, load_raw, make_trace, record_align_trace, run_kda
from traces.format.io import CHECKSUM_KEY, file_metadata
from traces.format.schema import BUFFERS, INPUTS, PARAMS, BufferSizes, Dims, Event, Manifest, TraceError
from traces.format.validate import TensorMeta, validate_trace

calls: list[str] = []


def _spy() -> types.ModuleType:
    """The reference, noting every op it is asked to run."""
    spy = types.ModuleType("kda_hostile_spy")
    for name in ("KDARecoverSSMRecords", "CommitPlan", "allocate_records", "NULL_BLOCK_ID"):
        setattr(spy, name, getattr(ref, name))
    for op in ("verify", "plan", "defer", "commit", "flush"):
        def noted(*args, _op=op, **kwargs):
            calls.append(_op)
            return getattr(ref, f"kda_recoverssm_{_op}")(*args, **kwargs)
        setattr(spy, f"kda_recoverssm_{op}", noted)
    return spy


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    return make_trace(tmp_path_factory.mktemp("hostile") / "mixed.safetensors")


@pytest.fixture(scope="module")
def align(tmp_path_factory) -> Path:
    """A recorded align-mode decode loop: plan events with a block table."""
    return record_align_trace(tmp_path_factory.mktemp("hostile") / "align.safetensors")


def write_raw(path: Path, manifest: dict | str, tensors: dict[str, torch.Tensor]) -> Path:
    """A file with valid checksums over whatever manifest (dict or JSON text) and tensors it is given."""
    text = manifest if isinstance(manifest, str) else json.dumps(manifest)
    save_file({n: t.contiguous() for n, t in tensors.items()}, str(path), metadata=file_metadata(text, tensors))
    return path


def refused(args: list[str], capsys, monkeypatch) -> str:
    """Run ``kda ARGS`` through the spy; assert exit 2, one ``Error:`` line, no call. Returns the line."""
    monkeypatch.setitem(sys.modules, "kda_hostile_spy", _spy())
    calls.clear()
    if args[0] == "replay":
        args = [*args, "--impl", "kda_hostile_spy", "--no-progress"]
    code, out, err = run_kda(args, capsys, monkeypatch)
    lines = err.splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    assert "Traceback" not in out + err
    assert not calls, calls
    return lines[0]


def _plan_event(m: dict) -> int:
    return next(i for i, e in enumerate(m["events"]) if e["op"] == "plan" and "block_table" in e["inputs"])


# -- align mode: every column the plan computes stays inside the block table ---------------

@pytest.mark.parametrize("computed,block_size,planted", [
    (INT32_MAX, 4, None), (INT32_MAX - 2, 4, None), (INT32_MAX - 3, 4, 5), (2**30, 2**30, None),
])
def test_num_computed_near_int32_max_is_refused(align, tmp_path, capsys, monkeypatch, computed, block_size,
                                                planted):
    m, t = load_raw(align)
    i = _plan_event(m)
    e = m["events"][i]
    e["attrs"]["block_size"] = block_size
    t[e["inputs"]["num_computed"]] = torch.full_like(t[e["inputs"]["num_computed"]], computed)
    if planted is not None:
        t[e["inputs"]["block_table"]] = torch.full_like(t[e["inputs"]["block_table"]], planted)
    line = refused(["replay", str(write_raw(tmp_path / "t.safetensors", m, t))], capsys, monkeypatch)
    assert f"event {i} (plan)" in line and ("num_computed" in line or "block_size" in line), line


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["overflow", "width 0"])
def test_the_triton_kernels_never_see_an_align_trace_validation_refuses(align, tmp_path, capsys, monkeypatch, case):
    """The same traces through ``--impl triton``: on a GPU, an out-of-bounds plan would be an
    illegal memory access; here the refusal comes first."""
    m, t = load_raw(align)
    e = m["events"][_plan_event(m)]
    table, computed = e["inputs"]["block_table"], e["inputs"]["num_computed"]
    if case == "width 0":
        t[table] = t[table][:, :0]
    else:
        e["attrs"]["block_size"] = 4
        t[computed] = torch.full_like(t[computed], INT32_MAX)
    path = write_raw(tmp_path / "t.safetensors", m, t)
    code, out, err = run_kda(["replay", str(path), "--impl", "triton", "--no-progress"], capsys, monkeypatch)
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("Error: "), (code, err)


def test_block_table_of_width_zero_is_refused(align, tmp_path, capsys, monkeypatch):
    m, t = load_raw(align)
    e = m["events"][_plan_event(m)]
    t[e["inputs"]["block_table"]] = t[e["inputs"]["block_table"]][:, :0]
    line = refused(["replay", str(write_raw(tmp_path / "t.safetensors", m, t))], capsys, monkeypatch)
    assert "block_table" in line and "width 0" in line, line


@pytest.mark.gpu
def test_empty_block_table_in_process_is_a_value_error(device):
    from kernels import CommitPlan, kda_recoverssm_plan

    one = torch.ones(1, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="block_table"):
        kda_recoverssm_plan(CommitPlan.allocate(1, device), one, torch.tensor([0, 1], dtype=torch.int32, device=device),
                            one, 4, torch.zeros(1, 0, dtype=torch.int32, device=device), one, 4)


@pytest.mark.gpu
def test_plan_columns_do_not_overflow_at_int32_max(device):
    """The kernel's column arithmetic is 64-bit: ``num_computed`` at the top of int32 gives
    the reference's plan, not a read before the table."""
    from kernels import CommitPlan, kda_recoverssm_plan

    def ints(values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    B, T = 3, 4
    accepted, qsl, slots = ints([4, 1, 3]), ints([0, 4, 8, 12]), ints([1, 2, 3])
    table = ints([[1, 4], [2, 5], [3, 6]])
    computed = ints([INT32_MAX, INT32_MAX - 1, INT32_MAX - 4])
    got = kda_recoverssm_plan(CommitPlan.allocate(B, device), accepted, qsl, slots, T, table, computed, 4)
    want = ref.kda_recoverssm_plan(ref.CommitPlan.allocate(B, device), accepted, qsl, slots, T, table, computed, 4)
    for field in ("commit_lens", "final_state_indices", "boundary_state_indices", "boundary_recovery_lens"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field
    assert got.final_state_indices.tolist() == [4, 5, 6]


# -- buffers: one tensor a role, record rows bounded -------------------------------------

def test_one_tensor_for_two_roles_is_refused(mixed, tmp_path, capsys, monkeypatch):
    m, t = load_raw(mixed)
    gone = m["initial"]["plan.boundary_recovery_lens"]
    m["initial"]["plan.boundary_recovery_lens"] = m["initial"]["plan.final_state_indices"]
    del t[gone]
    line = refused(["replay", str(write_raw(tmp_path / "t.safetensors", m, t))], capsys, monkeypatch)
    assert m["initial"]["plan.final_state_indices"] in line and "two roles" in line, line


def test_commit_without_record_indices_needs_a_record_row_per_row(mixed, tmp_path, capsys, monkeypatch):
    m, t = load_raw(mixed)
    P = m["buffers"]["plan_rows"] = m["buffers"]["num_record_rows"] + 1
    for section in ("initial", "final"):
        for role, name in m[section].items():
            if role.startswith("plan."):
                t[name] = torch.cat([t[name], t[name].new_zeros(P - t[name].shape[0])])
    i = next(i for i, e in enumerate(m["events"]) if e["op"] == "commit")
    e = m["events"][i]
    del t[e["inputs"].pop("record_indices")]
    t[e["inputs"]["state_indices"]] = torch.full((P,), -1, dtype=torch.int32)
    line = refused(["replay", str(write_raw(tmp_path / "t.safetensors", m, t))], capsys, monkeypatch)
    assert f"event {i} (commit)" in line and "record rows" in line, line


# -- the container and its JSON ----------------------------------------------------------

def _nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


def test_deeply_nested_manifest_and_checksums_are_refused(mixed, tmp_path, capsys, monkeypatch):
    m, t = load_raw(mixed)
    text = json.dumps(m)[:-1] + ', "provenance": ' + _nested(100_000) + "}"
    line = refused(["info", str(write_raw(tmp_path / "m.safetensors", text, t))], capsys, monkeypatch)
    assert "nested" in line, line
    meta = file_metadata(json.dumps(m), t)
    meta[CHECKSUM_KEY] = _nested(100_000)
    save_file(t, str(tmp_path / "c.safetensors"), metadata=meta)
    assert "checksums" in refused(["info", str(tmp_path / "c.safetensors")], capsys, monkeypatch)


@pytest.mark.parametrize("edit,fragment", [
    (lambda m: m.__setitem__("version", True), "version"),
    (lambda m: m.__setitem__("null_id", False), "null_id"),
    (lambda m: m.__setitem__("lower_bound", float("nan")), "NaN"),
    (lambda m: m.__setitem__("lower_bound", float("-inf")), "-Infinity"),
    (lambda m: m.__setitem__("lower_bound", "1e999"), "1e999"),
])
def test_strict_json_in_the_manifest(mixed, tmp_path, capsys, monkeypatch, edit, fragment):
    m, t = load_raw(mixed)
    edit(m)
    text = json.dumps(m).replace('"1e999"', "1e999")
    line = refused(["replay", str(write_raw(tmp_path / "t.safetensors", text, t))], capsys, monkeypatch)
    assert fragment in line, line


def test_duplicate_key_in_the_manifest_is_refused(mixed, tmp_path, capsys, monkeypatch):
    m, t = load_raw(mixed)
    text = json.dumps(m)[:-1] + ', "version": 1}'
    line = refused(["info", str(write_raw(tmp_path / "t.safetensors", text, t))], capsys, monkeypatch)
    assert "duplicate key 'version'" in line, line


def test_duplicate_tensor_in_the_header_is_refused(mixed, tmp_path, capsys, monkeypatch):
    data = mixed.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8: 8 + n])
    name = next(k for k in header if k != "__metadata__")
    entries = [json.dumps(k) + ":" + json.dumps(v) for k, v in header.items()]
    entries.insert(0, json.dumps(name) + ":" + json.dumps(header[name]))
    text = ("{" + ",".join(entries) + "}").encode()
    text += b" " * (-len(text) % 8)
    path = tmp_path / "dup.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n:])
    line = refused(["replay", str(path)], capsys, monkeypatch)
    assert "duplicate" in line and name in line, line


def test_tensor_the_manifest_does_not_name_is_refused(mixed, tmp_path, capsys, monkeypatch):
    m, t = load_raw(mixed)
    t["stowaway"] = torch.zeros(3)
    line = refused(["info", str(write_raw(tmp_path / "t.safetensors", m, t))], capsys, monkeypatch)
    assert "'stowaway'" in line and "not named by the manifest" in line, line


# -- what reaches the terminal -----------------------------------------------------------

def test_control_characters_in_a_tensor_name_are_escaped(mixed, tmp_path, capsys, monkeypatch):
    m, t = load_raw(mixed)
    e = m["events"][0]
    old = e["inputs"]["state_indices"]
    new = e["inputs"]["state_indices"] = "slots\nline two\x1b[2J\r"
    t[new] = t.pop(old).clone()
    t[new][0] = m["buffers"]["num_slots"]
    line = refused(["replay", str(write_raw(tmp_path / "t.safetensors", m, t))], capsys, monkeypatch)
    assert "slots\\nline two" in line and "\\x1b[2J\\r" in line and "\x1b" not in line, line


def test_control_characters_in_a_file_name_are_escaped(tmp_path, capsys, monkeypatch):
    path = tmp_path / "bad\nname\x1b[31m.safetensors"
    path.write_bytes(b"")
    line = refused(["replay", str(path)], capsys, monkeypatch)
    assert "bad\\nname\\x1b[31m" in line, line


def test_info_escapes_control_characters_in_provenance(mixed, tmp_path, capsys, monkeypatch):
    m, t = load_raw(mixed)
    m["provenance"]["note"] = "\x1b]0;owned\x07\x1b[31mred\x9b\nsecond line"
    m["provenance"]["gpu\x1b[1m"] = {"name\r": "\x1b[0m"}
    path = write_raw(tmp_path / "t.safetensors", m, t)
    code, out, err = run_kda(["info", str(path)], capsys, monkeypatch)
    assert code == 0, err
    for bad in ("\x1b", "\x07", "\x9b", "\r"):
        assert bad not in out, repr(out)
    assert "\\x1b]0;owned\\x07\\x1b[31mred\\x9b\\nsecond line" in out
    assert len(out.splitlines()) == 5 + len(m["provenance"]), out


def test_token_offsets_beyond_int32_are_refused():
    """A verify whose activation tensors pass 2**31 elements would overflow the kernels'
    int32 token offsets: refused from the header's shapes alone."""

    H, K, V, T = 16, 128, 128, 4
    B = 2**20 // T + 1
    sizes = {"N": 2, "R": 1, "P": 1, "H": H, "K": K, "V": V, "T": T, "2K": 2 * K, "HK": H * K, "Ttot": B * T,
             "B": B, "B+1": B + 1}
    dtypes = {"act": "bfloat16", "state": "float32"}
    metas: dict[str, TensorMeta] = {}
    small = {"qsl": torch.arange(0, B * T + 1, T, dtype=torch.int32), "rows": torch.full((B,), -1, dtype=torch.int32)}
    loads: dict[str, torch.Tensor] = {}

    def name(section: str, role: str, spec) -> str:
        n = f"{section}.{role}"
        metas[n] = TensorMeta(tuple(s if isinstance(s, int) else sizes[s] for s in spec.shape),
                              dtypes.get(spec.dtype, spec.dtype))
        if spec.dtype == "int32":
            loads[n] = small["qsl"] if role == "query_start_loc" else \
                small["rows"] if spec.shape == ("B",) else torch.zeros(metas[n].shape, dtype=torch.int32)
        return n
    m = Manifest(Dims(H, K, V, T), "bfloat16", "float32", None, BufferSizes(2, 1, 1),
                 {r: name("params", r, s) for r, s in PARAMS.items()},
                 {r: name("initial", r, s) for r, s in BUFFERS.items()},
                 events=[Event("verify", {r: name("in", r, s) for r, s in INPUTS["verify"].items()})])
    source = types.SimpleNamespace(meta=metas.get, load=loads.__getitem__)
    with pytest.raises(TraceError, match="event 0 \\(verify\\): 1048580 tokens"):
        validate_trace(m, source)


def test_replay_escapes_a_tensor_name_in_its_mismatch_report(mixed, tmp_path, capsys, monkeypatch):
    m, t = load_raw(mixed)
    e = m["events"][0]
    old = e["expected"]["out"]
    new = e["expected"]["out"] = "out\x1b]0;owned\x07\n"
    t[new] = t.pop(old) + 1
    path = write_raw(tmp_path / "t.safetensors", m, t)
    code, out, err = run_kda(["replay", str(path), "--impl", "reference", "--no-progress"], capsys, monkeypatch)
    assert code == 1, err
    assert "out\\x1b]0;owned\\x07\\n" in out and "\x1b" not in out and "\x07" not in out, repr(out)


@pytest.mark.gpu
def test_a_plan_whose_tensors_share_memory_is_a_value_error(device):
    from kernels import kda_recoverssm_commit, kda_recoverssm_plan

    one = torch.ones(1, dtype=torch.int32, device=device)
    column = torch.zeros(2, dtype=torch.int32, device=device)
    shared = CommitPlan(column, column.clone(), column.clone(), column)  # recovery counts over the commit lengths
    with pytest.raises(ValueError, match="plan: its four tensors must not overlap in memory"):
        kda_recoverssm_plan(shared, one, torch.tensor([0, 1], dtype=torch.int32, device=device), one, 4)
    buffer = torch.zeros(5, dtype=torch.int32, device=device)  # each column one row into the next
    overlapping = CommitPlan(buffer[0:2], buffer[1:3], buffer[2:4], buffer[3:5])
    pool = torch.zeros(2, 1, 16, 16, device=device)
    records = ref.allocate_records(2, 1, 4, 16, 16, torch.float32, device)
    for plan in (shared, overlapping):
        with pytest.raises(ValueError, match="overlap in memory"):
            kda_recoverssm_commit(pool, records, torch.zeros(1, device=device), torch.zeros(16, device=device), None,
                                  one, plan)


def _flush_buffers(device, **change):
    """A two-row flush (slots 1, 2, record rows 0, 1, counts 2 and 3), with ``change``d arguments."""
    args = dict(checkpoint_state=torch.zeros(3, 1, 16, 16, device=device),
                records=ref.allocate_records(2, 1, 4, 16, 16, torch.float32, device),
                A_log=torch.zeros(1, device=device), dt_bias=torch.zeros(16, device=device), lower_bound=None,
                state_indices=torch.tensor([1, 2], dtype=torch.int32, device=device),
                record_rows=torch.tensor([0, 1], dtype=torch.int32, device=device),
                pending=torch.tensor([2, 3], dtype=torch.int32, device=device),
                plan=CommitPlan.allocate(2, device))
    return {**args, **change}


@pytest.mark.parametrize("impl", ["triton", "reference"])
@pytest.mark.parametrize("change, message", [
    ("short column", "plan.final_state_indices: holds 1 rows, the batch has 2"),
    ("short pending", "pending: holds 1 counts, records hold 2 rows"),
    ("strided pool", "checkpoint_state: expected a contiguous tensor"),
])
def test_a_flush_refuses_bad_buffers_before_it_consumes_a_count(device, impl, change, message):
    """Buffers whose shapes would send a kernel past them (a plan column or the pending
    counts shorter than the rows they serve) or that the commit half refuses: a
    ``ValueError`` before any launch, the counts and the plan as they were."""
    from kernels import reference

    api = kernels if impl == "triton" else reference
    plan = CommitPlan.allocate(2, device)
    pending = torch.tensor([2, 3], dtype=torch.int32, device=device)
    if change == "short column":
        plan = CommitPlan(plan.commit_lens, plan.final_state_indices[:1], plan.boundary_state_indices,
                          plan.boundary_recovery_lens)
    args = _flush_buffers(device, plan=plan, pending=pending)
    if change == "short pending":
        args["pending"] = pending[:1]
    if change == "strided pool":
        args["checkpoint_state"] = torch.zeros(3, 1, 16, 32, device=device)[..., :16]
    with pytest.raises(ValueError, match=re.escape(message)):
        api.kda_recoverssm_flush(**args)
    assert pending.tolist() == [2, 3] and not plan.commit_lens.any()

