"""Malformed traces: over 500 damaged or invalid files, each given to a command that reads
every tensor (replay, slice, repro), in this process.

Every case must end in exit 2 with exactly one ``Error:`` line on stderr, no traceback,
the input file byte-identical afterwards, no output left behind, and no kernel call with
an index outside its buffer (a spy implementation checks every call), all within a few
seconds. Byte flips inside tensor data are caught by the trace's checksums.

Generated families then draw hostile cases from a seed each: align-mode plans whose
columns would leave the block table or int32, one tensor for two roles, non-JSON numbers,
duplicate keys (in the manifest and in the safetensors header), deep nesting, control
characters in tensor names, unnamed tensors; recording shards with a flipped byte; and
align-mode plans at the top of the documented range, kernel against reference.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import signal
import struct
import sys
import types
import unicodedata
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import kernels.reference as ref
from tests.support.trace_helpers import INT32_MAX, load_raw, record_align_trace, run_kda
from traces.format.io import CHECKSUM_KEY, file_metadata
from traces.synth.simulation import SynthConfig, synthesize

SEED = 20261202
CASE_SECONDS = 20

# -- a spy implementation: the reference, refusing nothing, noting any out-of-range index --

violations: list[str] = []
calls: list[str] = []


def _in_range(what: str, t, lo: int, hi: int) -> None:
    if t is None:
        return
    if t.dtype.is_floating_point or (t.numel() and (int(t.min()) < lo or int(t.max()) >= hi)):
        violations.append(f"{what}: {t.tolist()} outside [{lo}, {hi})")


def _spy_module() -> types.ModuleType:
    spy = types.ModuleType("kda_fuzz_spy")
    for name in ("KDARecoverSSMRecords", "CommitPlan", "allocate_records", "NULL_BLOCK_ID"):
        setattr(spy, name, getattr(ref, name))

    def verify(q, k, v, raw_g, raw_beta, A_log, dt_bias, lb, pool, records, qsl, slots, T, out=None,
               record_indices=None):
        calls.append("verify")
        _in_range("verify slots", slots, -1, pool.shape[0])
        _in_range("verify record rows", record_indices, -1, records.correction.shape[0])
        _in_range("verify query_start_loc", qsl, 0, q.shape[1] + 1)
        return ref.kda_recoverssm_verify(q, k, v, raw_g, raw_beta, A_log, dt_bias, lb, pool, records, qsl, slots, T,
                                         out=out, record_indices=record_indices)

    def plan(p, accepted, qsl, slots, T, block_table=None, num_computed=None, block_size=None):
        calls.append("plan")
        _in_range("plan slots", slots, -1, 1 << 20)
        _in_range("plan rows", slots.new_zeros(1) + slots.shape[0] - 1, 0, p.commit_lens.shape[0])
        return ref.kda_recoverssm_plan(p, accepted, qsl, slots, T, block_table, num_computed, block_size)

    def defer(p, slots, rows, pending, eager=None):
        calls.append("defer")
        _in_range("defer record rows", rows, -1, pending.shape[0])
        return ref.kda_recoverssm_defer(p, slots, rows, pending, eager)

    def commit(pool, records, A_log, dt_bias, lb, slots, p, record_indices=None):
        calls.append("commit")
        B = slots.shape[0]
        _in_range("commit slots", slots, -1, pool.shape[0])
        _in_range("commit record rows", record_indices, -1, records.correction.shape[0])
        _in_range("commit final slots", p.final_state_indices[:B], -1, pool.shape[0])
        _in_range("commit boundary slots", p.boundary_state_indices[:B], -1, pool.shape[0])
        return ref.kda_recoverssm_commit(pool, records, A_log, dt_bias, lb, slots, p, record_indices)

    def flush(pool, records, A_log, dt_bias, lb, slots, rows, pending, p, consume_pending=True):
        calls.append("flush")
        _in_range("flush slots", slots, -1, pool.shape[0])
        _in_range("flush record rows", rows, -1, pending.shape[0])
        return ref.kda_recoverssm_flush(pool, records, A_log, dt_bias, lb, slots, rows, pending, p, consume_pending)

    spy.kda_recoverssm_verify, spy.kda_recoverssm_plan, spy.kda_recoverssm_defer = verify, plan, defer
    spy.kda_recoverssm_commit, spy.kda_recoverssm_flush = commit, flush
    return spy


# -- the mutations ------------------------------------------------------------------------

def _rewrite(manifest: dict, tensors: dict[str, torch.Tensor], tmp: Path) -> bytes:
    """A file with valid checksums over whatever manifest and tensors it is given."""
    text = json.dumps(manifest)
    save_file({n: t.contiguous() for n, t in tensors.items()}, str(tmp), metadata=file_metadata(text, tensors))
    return tmp.read_bytes()


def _header_padding(data: bytes) -> range:
    """Bytes of the spaces safetensors pads its header with: whitespace, not content."""
    n = struct.unpack("<Q", data[:8])[0]
    header = data[8: 8 + n]
    return range(8 + len(header.rstrip(b" ")), 8 + n)


def _index_tensors(manifest: dict, roles: tuple[str, ...]) -> list[str]:
    return [name for e in manifest["events"] for role, name in e["inputs"].items() if role in roles]


def _cases(valid: bytes, tmp: Path) -> list[tuple[str, bytes]]:
    rng = random.Random(SEED)
    tmp.write_bytes(valid)
    manifest, tensors = load_raw(tmp)
    N, R = manifest["buffers"]["num_slots"], manifest["buffers"]["num_record_rows"]
    cases: list[tuple[str, bytes]] = []
    padding = _header_padding(valid)
    positions = [i for i in range(len(valid)) if i not in padding]

    for i in range(220):  # 1 to 3 flipped bytes anywhere: length field, header, manifest, data
        data = bytearray(valid)
        for pos in rng.sample(positions, rng.randint(1, 3)):
            data[pos] ^= rng.randint(1, 255)
        cases.append((f"flip-{i}", bytes(data)))
    header_end = 8 + struct.unpack("<Q", valid[:8])[0]
    for i in range(30):  # flips confined to the header JSON
        data = bytearray(valid)
        pos = rng.choice([p for p in range(8, header_end) if p not in padding])
        data[pos] ^= rng.randint(1, 255)
        cases.append((f"header-flip-{i}", bytes(data)))
    for i, cut in enumerate([0, 1, 7, 8, 9, header_end - 1, header_end, header_end + 1, len(valid) - 1]
                            + rng.sample(range(len(valid)), 51)):
        cases.append((f"truncate-{i}-at-{cut}", valid[:cut]))
    huge = [2**64 - 1, 2**63, 2**40, 2**31, 100_000_001, len(valid), len(valid) - 7, 0, 1, 2, header_end - 9]
    for i, n in enumerate(huge + [rng.randrange(2**64) for _ in range(29)]):
        cases.append((f"header-length-{i}-{n}", struct.pack("<Q", n) + valid[8:]))

    def edited(name: str, edit) -> None:
        m, t = json.loads(json.dumps(manifest)), dict(tensors)
        edit(m, t)
        cases.append((name, _rewrite(m, t, tmp)))

    for key, value in (("version", 2), ("version", 0), ("version", "1"), ("version", None), ("format", "kda"),
                       ("null_id", 1), ("lower_bound", "x"), ("lower_bound", True), ("events", {}),
                       ("dims", []), ("params", None), ("initial", {}), ("provenance", "x"), ("dtypes", {})):
        edited(f"manifest-{key}-{value!r}", lambda m, t, k=key, v=value: m.__setitem__(k, v))
    for key in ("format", "version", "dims", "dtypes", "buffers", "params", "initial", "events", "null_id"):
        edited(f"manifest-missing-{key}", lambda m, t, k=key: m.pop(k))
    for sym in ("H", "K", "V", "T"):
        for value in (0, -1, 1.5, "2", True, None, 10**6):
            edited(f"dims-{sym}-{value!r}", lambda m, t, s=sym, v=value: m["dims"].__setitem__(s, v))
    for key in ("num_slots", "num_record_rows", "plan_rows"):
        for value in (0, -3, "4", 10**6):
            edited(f"buffers-{key}-{value!r}", lambda m, t, k=key, v=value: m["buffers"].__setitem__(k, v))
    for value in ("float8", "int32", 5):
        edited(f"dtype-activation-{value!r}", lambda m, t, v=value: m["dtypes"].__setitem__("activation", v))
    for i, event in enumerate(manifest["events"]):
        edited(f"event-{i}-op", lambda m, t, i=i: m["events"][i].__setitem__("op", "prefill"))
        edited(f"event-{i}-no-inputs", lambda m, t, i=i: m["events"][i]["inputs"].clear())
        edited(f"event-{i}-unknown-role", lambda m, t, i=i: m["events"][i]["inputs"].__setitem__("x", "params.A_log"))
        edited(f"event-{i}-attrs", lambda m, t, i=i: m["events"][i].__setitem__("attrs", {"block_size": 8}))
        edited(f"event-{i}-missing-tensor", lambda m, t, i=i: t.pop(next(iter(m["events"][i]["inputs"].values()))))

    names = sorted(tensors)
    swaps = {torch.float32: torch.int32, torch.bfloat16: torch.float16, torch.int32: torch.int64,
             torch.float16: torch.float32, torch.float64: torch.float32, torch.bool: torch.float32}
    for name in rng.sample(names, 50):
        edited(f"dtype-{name}", lambda m, t, n=name: t.__setitem__(n, t[n].to(swaps[t[n].dtype])))
    for i, name in enumerate(rng.sample(names, 50)):
        def reshape(m, t, n=name, i=i):
            x = t[n]
            t[n] = x.reshape(-1)[:-1] if i % 3 == 0 and x.numel() > 1 else \
                x.unsqueeze(0) if i % 3 == 1 else torch.cat([x, x[:1]]) if x.dim() and x.shape[0] else \
                torch.zeros(1, 1, dtype=x.dtype)
        edited(f"shape-{name}", reshape)
    slot_tensors = _index_tensors(manifest, ("state_indices",))
    row_tensors = _index_tensors(manifest, ("record_indices", "record_rows"))
    qsl_tensors = _index_tensors(manifest, ("query_start_loc",))
    for i in range(60):
        name, bad = [(rng.choice(slot_tensors), rng.choice([N, N + 100, -2, 2**31 - 1, -2**31])),
                     (rng.choice(row_tensors), rng.choice([R, R + 7, -2, 2**31 - 1])),
                     (rng.choice(qsl_tensors), rng.choice([-1, 10**6]))][i % 3]

        def out_of_range(m, t, n=name, v=bad, j=rng.randrange(64)):
            x = t[n].clone()
            x[j % x.numel()] = v
            t[n] = x
        edited(f"index-{name}-{bad}", out_of_range)
    for name in rng.sample(slot_tensors + row_tensors + qsl_tensors, 20):
        def nan(m, t, n=name):
            x = t[n].to(torch.float32)
            x[0] = float("nan")
            t[n] = x
        edited(f"nan-{name}", nan)
    for i, name in enumerate(rng.sample(names, 4)):
        m, t = manifest, dict(tensors)
        meta = file_metadata(json.dumps(m), t)
        sums = json.loads(meta[CHECKSUM_KEY])
        if i == 0:
            sums["tensors"].pop(name)
        elif i == 1:
            sums["tensors"][name] = "00000000"
        elif i == 2:
            sums["manifest"] = "ffffffff"
        else:
            sums = "not an object"
        meta[CHECKSUM_KEY] = json.dumps(sums)
        save_file({n: x.contiguous() for n, x in t.items()}, str(tmp), metadata=meta)
        cases.append((f"checksums-{i}", tmp.read_bytes()))
    meta = {**file_metadata(json.dumps(manifest), tensors), "extra": "1"}
    save_file({n: x.contiguous() for n, x in tensors.items()}, str(tmp), metadata=meta)
    cases.append(("extra-metadata", tmp.read_bytes()))
    unique: dict[bytes, str] = {}
    for name, data in cases:
        unique.setdefault(data, name)
    return [(name, data) for data, name in unique.items()]


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


@pytest.fixture(scope="module")
def valid_trace(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("fuzz") / "valid.safetensors"
    config = SynthConfig(preset="tiny", mode="mixed", requests=2, seed=1, max_batch=2, max_decode_steps=2)
    synthesize(config).write(path)
    return path.read_bytes()


def test_malformed_traces_fail_cleanly(valid_trace, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "kda_fuzz_spy", _spy_module())
    folder = tmp_path / "case"
    folder.mkdir()
    trace = folder / "trace.safetensors"

    trace.write_bytes(valid_trace)  # the baseline: the spy runs every op and finds nothing to report
    code, out, err = run_kda(["replay", str(trace), "--impl", "kda_fuzz_spy", "--no-progress"], capsys, monkeypatch)
    assert code == 0, err
    assert set(calls) == {"verify", "plan", "defer", "commit", "flush"} and not violations

    cases = _cases(valid_trace, tmp_path / "rewrite.safetensors")
    assert len(cases) >= 500
    commands = (
        lambda: ["replay", str(trace), "--impl", "kda_fuzz_spy", "--no-progress"],
        lambda: ["slice", str(trace), "--events", "1:3", "--out", str(folder / "sliced.safetensors")],
        lambda: ["repro", str(trace), "--out", str(folder / "bundle"), "--impl", "kda_fuzz_spy"],
    )
    previous = signal.signal(signal.SIGALRM, _alarm)
    failures = []
    try:
        for i, (name, data) in enumerate(cases):
            trace.write_bytes(data)
            digest = hashlib.sha256(data).hexdigest()
            args = commands[i % len(commands)]()
            signal.alarm(CASE_SECONDS)
            try:
                code, out, err = run_kda(args, capsys, monkeypatch)
            except _Hang:
                code, out, err = -1, "", f"no answer within {CASE_SECONDS} s"
            finally:
                signal.alarm(0)
            lines = [line for line in err.splitlines() if line.strip()]
            problems = [
                f"exit {code}" if code != 2 else "",
                "not one Error: line" if len(lines) != 1 or not lines[0].startswith("Error:") else "",
                "traceback" if "Traceback" in out + err else "",
                "input changed" if hashlib.sha256(trace.read_bytes()).hexdigest() != digest else "",
                "output left" if sorted(p.name for p in folder.iterdir()) != ["trace.safetensors"] else "",
            ]
            if any(problems):
                failures.append(f"{name} ({args[0]}): {', '.join(p for p in problems if p)}: {err.strip()[:200]}")
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert not failures, f"{len(failures)} cases:\n" + "\n".join(failures[:20])
    assert not violations, violations[:5]


# -- generated families: hostile traces and shards; each case is drawn from its family and
# seed, both in the test's id, so a failure names what reproduces it --------------------

HOSTILE = "\n\r\x1b[2J\x1b]0;t\x07\x9b\u202e\u2028\x00\x7f"
"""Characters a name or provenance must never carry to the terminal."""


@pytest.fixture(scope="module")
def align_trace(tmp_path_factory) -> Path:
    return record_align_trace(tmp_path_factory.mktemp("fuzz") / "align.safetensors")


def _align_bounds(rng: random.Random, m: dict, t: dict) -> None:
    """A plan whose block-table columns leave the table or int32: width 0, a block size out
    of range, or a num_computed past INT32_MAX - block_size (table planted with real slots)."""
    e = rng.choice([e for e in m["events"] if "block_table" in e["inputs"]])
    table, computed = e["inputs"]["block_table"], e["inputs"]["num_computed"]
    kind = rng.randrange(3)
    if kind == 0:
        t[table] = t[table][:, :0].clone()
        return
    T = m["dims"]["T"]
    if kind == 1:  # a block size in range, a num_computed past it
        bs = rng.choice([T, rng.randint(T, 2**31 - 1)])
        low = INT32_MAX - bs + 1
    else:  # a block size out of range, any num_computed
        bs, low = rng.choice([2**31, 2**32 + 4, rng.randint(-4, T - 1)]), 0
    e["attrs"]["block_size"] = bs
    planted = torch.Generator().manual_seed(rng.randrange(2**31))
    t[table] = torch.randint(-1, m["buffers"]["num_slots"], t[table].shape, generator=planted, dtype=torch.int32)
    x = t[computed].clone()
    x[rng.randrange(x.numel())] = rng.randint(low, INT32_MAX)
    t[computed] = x


def _aliased(rng: random.Random, m: dict, t: dict) -> None:
    """Two roles named for one tensor (the orphan dropped from the file)."""
    slots = [(m[s], r) for s in ("params", "initial", "final") for r in m[s]]
    slots += [(e[s], r) for e in m["events"] for s in ("inputs", "expected") for r in e[s]]
    (a, ra), (b, rb) = rng.sample(slots, 2)
    t.pop(b[rb], None)
    b[rb] = a[ra]


def _non_json_number(rng: random.Random, m: dict, t: dict) -> str:
    """A number of the manifest replaced by NaN, +-Infinity, an overflowing float or a boolean."""
    section, key = rng.choice([(m, "version"), (m, "null_id"), (m, "lower_bound"),
                               *((m["dims"], k) for k in m["dims"]), *((m["buffers"], k) for k in m["buffers"])])
    section[key] = "@@"
    return json.dumps(m).replace('"@@"', rng.choice(["NaN", "Infinity", "-Infinity", "1e999", "-2e400", "true",
                                                     "false"]))


def _duplicate_key(rng: random.Random, m: dict, t: dict) -> str:
    """One key of a random object of the manifest written twice."""
    objects, stack = [], [m]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            objects += [x] if x else []
            stack += x.values()
        elif isinstance(x, list):
            stack += x
    obj = rng.choice(objects)
    key = rng.choice(list(obj))
    obj["@@dup"] = obj[key]
    return json.dumps(m).replace('"@@dup"', json.dumps(key))


def _deep(rng: random.Random, m: dict, t: dict) -> str:
    depth = rng.choice([33, 40, 1000, 100_000])
    opener, closer = rng.choice([("[", "]"), ('{"a": ', "}")])
    m["provenance"]["note"] = "@@"
    return json.dumps(m).replace('"@@"', opener * depth + "0" + closer * depth)


def _control_name(rng: random.Random, m: dict, t: dict) -> None:
    """A tensor renamed with control characters, and stored in a wrong dtype, so the error names it."""
    e = rng.choice(m["events"])
    role = rng.choice(list(e["inputs"]))
    old = e["inputs"][role]
    new = e["inputs"][role] = "".join(rng.choice(HOSTILE + "ab.[/]{}%\\'\"") for _ in range(rng.randint(1, 12)))
    t[new] = t.pop(old).to(torch.float64)


def _unnamed(rng: random.Random, m: dict, t: dict) -> None:
    for _ in range(rng.randint(1, 3)):
        t["".join(rng.choice(HOSTILE + "xyz") for _ in range(rng.randint(1, 8)))] = torch.zeros(rng.randint(0, 3))


def _header_duplicate(rng: random.Random, data: bytes) -> bytes:
    """A tensor's header entry written twice, at a random place."""
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8: 8 + n])
    entries = [json.dumps(k) + ":" + json.dumps(v) for k, v in header.items()]
    name = rng.choice([k for k in header if k != "__metadata__"])
    entries.insert(rng.randrange(len(entries) + 1), json.dumps(name) + ":" + json.dumps(header[name]))
    text = ("{" + ",".join(entries) + "}").encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data[8 + n:]


FAMILIES = {"align-bounds": _align_bounds, "aliased": _aliased, "non-json-number": _non_json_number,
            "duplicate-key": _duplicate_key, "deep": _deep, "control-name": _control_name, "unnamed": _unnamed,
            "header-duplicate": _header_duplicate}
FAMILY_SEEDS = range(5)


@pytest.mark.parametrize("seed", FAMILY_SEEDS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_generated_hostile_traces_are_refused(family, seed, valid_trace, align_trace, tmp_path, capsys,
                                              monkeypatch):
    """Each family's cases: exit 2, one inert ``Error:`` line, no kernel call."""
    rng = random.Random(f"{family}/{seed}")
    base = align_trace.read_bytes() if family == "align-bounds" else valid_trace
    path = tmp_path / "trace.safetensors"
    if family == "header-duplicate":
        path.write_bytes(_header_duplicate(rng, base))
    else:
        path.write_bytes(base)
        m, t = load_raw(path)
        text = FAMILIES[family](rng, m, t)
        save_file({n: x.contiguous() for n, x in t.items()}, str(path),
                  metadata=file_metadata(text or json.dumps(m), t))
    monkeypatch.setitem(sys.modules, "kda_fuzz_spy", _spy_module())
    calls.clear()
    command = rng.choice([["replay", str(path), "--impl", "kda_fuzz_spy", "--no-progress"], ["info", str(path)]])
    code, out, err = run_kda(command, capsys, monkeypatch)
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("Error: "), (code, err)
    assert not any(unicodedata.category(ch)[0] == "C" or unicodedata.category(ch) in ("Zl", "Zp")
                   for ch in err[:-1]), repr(err)
    assert not calls and "Traceback" not in out + err


@pytest.mark.parametrize("seed", range(8))
def test_generated_damaged_shards_merge_up_to_the_damage(seed, tmp_path, capsys, monkeypatch):
    """A byte flipped anywhere but the header's padding in a random shard: the merge keeps
    the events before that shard's event and names the shard."""
    from tests.support.decode_loop import decode_loop
    from traces.record.recorder import Recorder

    rng = random.Random(f"shards/{seed}")
    rec = Recorder(tmp_path / "loop.safetensors", "reference")
    decode_loop(rec, "deferred", steps=2)
    for case in range(3):
        index = rng.randrange(1, rec.events)
        kind = rng.choice(["in", "out"])
        shards = tmp_path / f"case-{case}"  # one folder a case: two cases may draw the same shard
        shutil.copytree(rec.shards, shards)
        path = shards / f"{index:06d}.{kind}.safetensors"
        data = bytearray(path.read_bytes())
        padding = _header_padding(bytes(data))
        data[rng.choice([i for i in range(len(data)) if i not in padding])] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
        code, out, err = run_kda(["record", "merge", str(shards), str(tmp_path / "merged.safetensors"), "--format",
                                  "json", "--force"], capsys, monkeypatch)
        assert code == 0, err
        merged = json.loads(out)
        assert merged["events"] == index and merged["dropped_because"].startswith(path.name), merged


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(3))
def test_generated_align_plans_at_the_top_of_int32_match_the_reference(seed, device):
    """Align-mode plans anywhere in the documented range (num_computed up to INT32_MAX -
    block_size): the kernel's columns are the reference's."""
    from kernels import CommitPlan, kda_recoverssm_plan

    g = torch.Generator().manual_seed(seed)
    B, T, N = 64, 4, 9
    width = int(torch.randint(1, 6, (1,), generator=g))
    block_size = [T, 16, 2**20, 2**30][seed % 4]
    accepted = torch.randint(-1, T + 2, (B,), generator=g, dtype=torch.int32)
    qsl = torch.cat([torch.zeros(1), torch.randint(0, T + 1, (B,), generator=g).cumsum(0)]).to(torch.int32)
    slots = torch.randint(-1, N, (B,), generator=g, dtype=torch.int32)
    table = torch.randint(-1, N, (B, width), generator=g, dtype=torch.int32)
    top = INT32_MAX - block_size
    computed = torch.where(torch.rand(B, generator=g) < 0.5, top - torch.randint(0, 3 * block_size, (B,), generator=g),
                           torch.randint(0, width * block_size, (B,), generator=g)).clamp(0, top).to(torch.int32)
    accepted, qsl, slots, table, computed = (x.to(device) for x in (accepted, qsl, slots, table, computed))
    got = kda_recoverssm_plan(CommitPlan.allocate(B, device), accepted, qsl, slots, T, table, computed, block_size)
    want = ref.kda_recoverssm_plan(ref.CommitPlan.allocate(B, device), accepted, qsl, slots, T, table, computed,
                                   block_size)
    for field in ("commit_lens", "final_state_indices", "boundary_state_indices", "boundary_recovery_lens"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field
