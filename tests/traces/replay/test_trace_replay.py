"""Synthesis, replay and comparison: passing traces pass, tampered ones point at the element."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tests.support.trace_helpers import TINY, first_event, load_raw, make_trace, rewrite, run_kda
from traces.replay.compare import DEFAULT_TOLERANCES, Tolerance, bf16_ulp_distance, compare
from traces.format.io import CHECKSUM_KEY
from traces.synth.simulation import SynthConfig, synthesize


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return make_trace(tmp_path_factory.mktemp("replay") / "good.safetensors")


def _replay_json(args, capsys, monkeypatch):
    code, out, err = run_kda(["replay", *args, "--format", "json", "--no-progress"], capsys, monkeypatch)
    assert "Traceback" not in err
    return code, (json.loads(out) if out else None), err


@pytest.mark.parametrize("impl", ["triton", "reference"])
def test_synth_then_replay_passes(impl, good, capsys, monkeypatch):
    code, report, err = _replay_json([str(good), "--impl", impl], capsys, monkeypatch)
    assert code == 0, err
    assert report["passed"] and report["impl"] == impl and report["device"] == "cpu"
    assert set(report["summary"]) == {"verify", "plan", "defer", "commit", "flush", "write"}
    assert report["summary"]["write"]["tensors"] == 0  # applied, nothing to compare
    assert report["final"] and all(t["passed"] for t in report["final"])
    assert report["summary"]["verify"]["median_ms"] is None and report["timing"].startswith("not measured")
    compared = [t for e in report["events"] for t in e["tensors"]]
    assert {t["role"] for t in compared} >= {"out", "records.correction", "states", "pending", "commit_lens"}
    out = [t for t in compared if t["role"] == "out"]
    assert all(t["max_ulp"] is not None and t["compared"] > 0 for t in out)


@pytest.mark.parametrize("mode", ["stock", "deferred"])
def test_every_mode_replays_clean_with_the_reference(mode, tmp_path, capsys, monkeypatch):
    path = make_trace(tmp_path / f"{mode}.safetensors", SynthConfig(preset="tiny", mode=mode, requests=4, seed=5))
    code, report, err = _replay_json([str(path), "--impl", "reference"], capsys, monkeypatch)
    assert code == 0 and report["passed"], err
    ops = set(report["summary"]) - {"write"}  # a reused slot's prefill, where the schedule reuses one
    assert ops == ({"verify", "plan", "commit"} if mode == "stock" else {"verify", "plan", "defer", "commit", "flush"})


def test_synth_is_deterministic_per_seed():
    a, b = synthesize(TINY), synthesize(TINY)
    assert a.manifest.to_json() == b.manifest.to_json()
    assert all(torch.equal(a.tensors[n], b.tensors[n]) for n in a.tensors)
    c = synthesize(SynthConfig(**{**TINY.__dict__, "seed": TINY.seed + 1}))
    assert not torch.equal(a.tensors["params.A_log"], c.tensors["params.A_log"])


def _verify_rows(built) -> list[list[tuple[int, int]]]:
    """Each verify event's rows as (slot, query length)."""
    rows = []
    for e in built.manifest.events:
        if e.op == "verify":
            qsl = built.tensors[e.inputs["query_start_loc"]].tolist()
            rows.append([(int(s), b - a) for s, a, b in zip(built.tensors[e.inputs["state_indices"]], qsl, qsl[1:])])
    return rows


@pytest.mark.parametrize("mode", ["mixed", "stock", "deferred"])
def test_the_default_synth_trace_exercises_every_rule_a_kernel_can_break(mode):
    """At the defaults, whatever the seed: partial windows (the last step's all partial, as
    the final records keep them), padding rows with PAD_ID and with the null slot, and slots
    reused after a prefill."""
    from traces.format.schema import NULL_ID, PAD_ID

    for seed in range(4):
        built = synthesize(SynthConfig(mode=mode, seed=seed))
        steps, T = _verify_rows(built), built.manifest.dims.T
        assert any(0 < n < T for step in steps for s, n in step if s > NULL_ID), seed
        assert all(0 < n < T for s, n in steps[-1] if s > NULL_ID), seed
        padding = [(s, n) for step in steps for s, n in step if s <= NULL_ID]
        assert {s for s, _ in padding} == {PAD_ID, NULL_ID} and {n for _, n in padding} == {0}, seed
        assert any(e.op == "write" for e in built.manifest.events), seed
        slots = [s for step in steps for s, _ in step if s > NULL_ID]
        assert len(set(slots)) <= 5 < 8, seed  # 8 requests in 5 slots: some reused


@pytest.mark.parametrize("seed", range(4))
def test_a_write_past_the_window_fails_the_default_trace(seed, tmp_path, capsys, monkeypatch):
    """No seed of the default ``kda synth`` trace passes a verify that writes records past a
    row's window: the final records show it."""
    path = tmp_path / "t.safetensors"
    code, _, err = run_kda(["synth", str(path), "--seed", str(seed)], capsys, monkeypatch)
    assert code == 0, err
    impl = str(Path(__file__).resolve().parents[2] / "broken_impls" / "verify_writes_past_the_window.py")
    code, report, err = _replay_json([str(path), "--impl", impl], capsys, monkeypatch)
    assert code == 1, err
    assert [t["role"] for t in report["final"] if not t["passed"]] == ["records.correction"]
    assert all(t["passed"] for e in report["events"] for t in e["tensors"])


def _tamper_out(good, tmp_path):
    """Add 1.0 to one output element of a real row; return the path and where it is."""
    manifest, tensors = load_raw(good)
    i = first_event(manifest, "verify", "out")
    ev = manifest["events"][i]
    qsl = tensors[ev["inputs"]["query_start_loc"]]
    slots = tensors[ev["inputs"]["state_indices"]]
    b = next(b for b in range(len(slots)) if slots[b] > 0 and qsl[b + 1] > qsl[b] + 1)
    token, head, v = int(qsl[b]) + 1, 1, 5

    def edit(m, t):
        name = m["events"][i]["expected"]["out"]
        x = t[name].clone()
        x[0, token, head, v] += 1.0
        t[name] = x
    where = {"event": i, "op": "verify", "tensor": "out", "batch_row": b, "slot": int(slots[b]), "token": token,
             "t": 1, "head": head, "v": v}
    return rewrite(good, tmp_path / "tampered.safetensors", edit), where


def test_tampered_output_exits_1_and_names_the_element(good, tmp_path, capsys, monkeypatch):
    path, where = _tamper_out(good, tmp_path)
    code, report, _ = _replay_json([str(path), "--impl", "reference"], capsys, monkeypatch)
    assert code == 1 and not report["passed"]
    bad = [t for e in report["events"] for t in e["tensors"] if not t["passed"]]
    assert len(bad) == 1 and bad[0]["mismatches"] == 1
    first, worst = bad[0]["first_bad"], bad[0]["worst_bad"]
    assert {k: first[k] for k in where} == where
    assert first == worst
    assert math.isclose(first["expected"] - first["actual"], 1.0, rel_tol=0.05)

    code, out, err = run_kda(["replay", str(path), "--impl", "reference", "--no-progress"], capsys, monkeypatch)
    assert code == 1 and "FAIL" in out and err == ""
    coords = " ".join(f"{k}={v}" for k, v in where.items())
    assert coords in out, out


def test_tampered_state_names_slot_head_v_k(good, tmp_path, capsys, monkeypatch):
    manifest, tensors = load_raw(good)
    i = next(i for i, e in enumerate(manifest["events"])
             if e["op"] == "commit" and tensors[e["expected"]["slots"]].numel())
    slot = int(tensors[manifest["events"][i]["expected"]["slots"]][0])

    def edit(m, t):
        name = m["events"][i]["expected"]["states"]
        x = t[name].clone()
        x[0, 1, 2, 3] = float("nan")  # NaN never passes
        t[name] = x
    path = rewrite(good, tmp_path / "state.safetensors", edit)
    code, report, _ = _replay_json([str(path), "--impl", "reference", "--stop-at-first"], capsys, monkeypatch)
    assert code == 1 and report["stopped_early"]
    assert report["events"][-1]["index"] == i and not report["final"]
    (bad,) = [t for t in report["events"][-1]["tensors"] if not t["passed"]]
    assert bad["first_bad"]["slot"] == slot
    slots_at = tensors[manifest["events"][i]["inputs"]["state_indices"]]
    assert int(slots_at[bad["first_bad"]["batch_row"]]) == slot  # stock plan: the fold stays in place
    assert (bad["first_bad"]["head"], bad["first_bad"]["v"], bad["first_bad"]["k"]) == (1, 2, 3)
    assert bad["first_bad"]["expected"] == "nan"


def test_tampered_final_buffer_and_tolerance_override(good, tmp_path, capsys, monkeypatch):
    def edit(m, t):
        name = m["final"]["checkpoint_state"]
        x = t[name].clone()
        x[2, 0, 4, 7] += 1e-3
        t[name] = x
    path = rewrite(good, tmp_path / "final.safetensors", edit)
    code, report, _ = _replay_json([str(path), "--impl", "reference"], capsys, monkeypatch)
    assert code == 1
    (bad,) = [t for t in report["final"] if not t["passed"]]
    assert {k: bad["first_bad"][k] for k in ("event", "tensor", "slot", "head", "v", "k")} == {
        "event": "final", "tensor": "checkpoint_state", "slot": 2, "head": 0, "v": 4, "k": 7}
    code, report, _ = _replay_json([str(path), "--impl", "reference", "--atol", "float32=1e-2"], capsys, monkeypatch)
    assert code == 0 and report["tolerances"]["float32"] == {"atol": 1e-2, "rtol": DEFAULT_TOLERANCES["float32"].rtol}


def test_event_range_compares_only_those_events(good, capsys, monkeypatch):
    code, report, _ = _replay_json([str(good), "--impl", "reference", "--events", "2:5"], capsys, monkeypatch)
    assert code == 0
    assert [e["index"] for e in report["events"]] == [2, 3, 4] and report["final"] == []
    code, _, err = _replay_json([str(good), "--impl", "reference", "--events", "5:999"], capsys, monkeypatch)
    assert code == 2 and err.startswith("Error: --events 5:999")


def test_a_trace_without_events_is_refused_as_such(good, tmp_path, capsys, monkeypatch):
    """Nothing to replay or cut: bad input, and the error says why, not that a range is empty."""
    def drop_events(m, t):
        for e in m["events"]:
            for name in [*e["inputs"].values(), *e["expected"].values()]:
                t.pop(name)
        m["events"] = []
    empty = rewrite(good, tmp_path / "empty.safetensors", drop_events)
    for args, said in ((["replay", str(empty), "--impl", "reference"], "the trace has no events"),
                       (["slice", str(empty), "--events", "0:", "--out", str(tmp_path / "c.safetensors")],
                        "the trace has no events (--events 0:)")):
        code, out, err = run_kda(args, capsys, monkeypatch)
        assert code == 2 and out == "" and err.strip().splitlines() == [f"Error: {said}"]
    code, out, err = run_kda(["info", str(empty)], capsys, monkeypatch)
    assert code == 0 and "events: none" in out.splitlines()


def test_impl_from_a_py_file(good, tmp_path, capsys, monkeypatch):
    """A user's build that forgets the commit: replay through it finds the drift."""
    broken = tmp_path / "my_kernels.py"
    broken.write_text("from kernels.reference import *  # noqa\n"
                      "def kda_recoverssm_commit(*args, **kwargs):\n    return None\n")
    code, report, _ = _replay_json([str(good), "--impl", str(broken), "--stop-at-first"], capsys, monkeypatch)
    assert code == 1 and report["events"][-1]["op"] == "commit"
    assert report["impl"] == str(broken)

    raising = tmp_path / "raising.py"
    raising.write_text("from kernels.reference import *  # noqa\n"
                       "def kda_recoverssm_verify(*args, **kwargs):\n    raise RuntimeError('device lost')\n")
    code, _, err = _replay_json([str(good), "--impl", str(raising)], capsys, monkeypatch)
    assert code == 3 and "event 0 (verify)" in err and "device lost" in err

    partial = tmp_path / "partial.py"
    partial.write_text("from kernels.reference import kda_recoverssm_verify  # noqa\n")
    code, _, err = _replay_json([str(good), "--impl", str(partial)], capsys, monkeypatch)
    assert code == 2 and "lacks kda_recoverssm_plan" in err
    code, _, err = _replay_json([str(good), "--impl", "no_such_module_xyz"], capsys, monkeypatch)
    assert code == 2 and "cannot import" in err


def test_info_summarises_the_trace(good, capsys, monkeypatch):
    code, out, _ = run_kda(["info", str(good), "--format", "json"], capsys, monkeypatch)
    assert code == 0
    s = json.loads(out)
    manifest, _ = load_raw(good)
    assert s["events"] == len(manifest["events"]) and sum(s["events_per_op"].values()) == s["events"]
    assert s["dims"] == {"H": 2, "K": 16, "V": 16, "T": 4}
    assert s["buffers"] == manifest["buffers"] and s["provenance"]["producer"] == "kda synth"
    code, out, _ = run_kda(["info", str(good)], capsys, monkeypatch)
    assert code == 0 and "H=2 K=16 V=16 T=4" in out and "producer: kda synth" in out


def test_synth_cli_writes_and_rejects_bad_options(tmp_path, capsys, monkeypatch):
    out_path = tmp_path / "s.safetensors"
    code, out, _ = run_kda(["synth", str(out_path), "--requests", "2", "--mode", "stock", "--format", "json"],
                           capsys, monkeypatch)
    assert code == 0 and json.loads(out)["events"] > 0 and out_path.exists()
    code, _, err = run_kda(["synth", str(tmp_path / "x.safetensors"), "--mode", "eager"], capsys, monkeypatch)
    assert code == 2 and err.startswith("Error: --mode eager: expected one of stock, deferred, mixed")


def test_shipped_sample_is_small_k3_shaped_and_passes(capsys, monkeypatch):
    """What the README's first command runs: ``kda replay``, Triton kernels (the interpreter on a CPU)."""
    from importlib.resources import files

    sample = files("traces") / "samples" / "k3-tp8-sample.safetensors"
    assert sample.is_file() and sample.stat().st_size < 5 * 2**20
    manifest, _ = load_raw(sample)
    code, report, err = _replay_json([], capsys, monkeypatch)
    assert code == 0 and report["passed"] and report["impl"] == "triton", err
    assert report["final"] and len(report["events"]) == len(manifest["events"]) >= 10
    with safe_open(str(sample), "pt") as f:
        assert CHECKSUM_KEY in f.metadata()  # written by the current writer: read checked
    assert manifest["dims"] == {"H": 12, "K": 128, "V": 128, "T": 8} and manifest["lower_bound"] == -5.0
    assert {e["op"] for e in manifest["events"]} == {"verify", "plan", "defer", "commit", "flush"}


# -- compare -------------------------------------------------------------------------------

def test_nan_and_inf_never_pass_and_zeros_do_not_pass_by_atol():
    expected = torch.tensor([1.0, 2.0, 3.0, 4.0])
    tol = Tolerance(1e-3, 1e-3)
    c = compare(torch.tensor([1.0, float("nan"), 3.0, float("inf")]), expected, tol, tensor="x", role="x")
    assert c.mismatches == 2 and c.first_bad.index == (1,)
    both_nan = compare(torch.tensor([float("nan")]), torch.tensor([float("nan")]), tol, tensor="x", role="x")
    assert both_nan.mismatches == 1
    zeros = compare(torch.zeros(4), expected, tol, tensor="x", role="x")
    assert zeros.mismatches == 4 and zeros.rel_rmse == pytest.approx(1.0)


def test_metrics_mask_first_and_worst():
    expected = torch.tensor([[1.0, 10.0], [100.0, 1000.0]])
    actual = expected + torch.tensor([[0.5, 0.0], [3.0, 2.0]])
    c = compare(actual, expected, Tolerance(0.0, 0.01), tensor="x", role="x")
    assert c.mismatches == 2 and c.first_bad.index == (0, 0) and c.worst_bad.index == (0, 0)
    assert c.max_abs == 3.0 and c.max_rel == pytest.approx(0.5, rel=1e-5)
    masked = compare(actual, expected, Tolerance(0.0, 0.01), tensor="x", role="x",
                     mask=torch.tensor([[False, True], [True, True]]))
    assert masked.compared == 3 and masked.mismatches == 1 and masked.first_bad.index == (1, 0)


def test_bf16_ulp_distance():
    one = torch.tensor([1.0], dtype=torch.bfloat16)
    next_up = torch.tensor([1.0 + 2 ** -7], dtype=torch.bfloat16)
    assert int(bf16_ulp_distance(one, next_up)) == 1
    assert int(bf16_ulp_distance(torch.tensor([0.0], dtype=torch.bfloat16),
                                 torch.tensor([-0.0], dtype=torch.bfloat16))) == 0
    tiny = torch.tensor([2 ** -133], dtype=torch.bfloat16)  # the smallest positive subnormal
    assert int(bf16_ulp_distance(tiny, -tiny)) == 2
    c = compare(next_up, one, DEFAULT_TOLERANCES["bfloat16"], tensor="o", role="out")
    assert c.passed and c.max_ulp == 1


SURFACE_ROUTES = {"verify": "tests/support/documented_surface.py (kda_recoverssm_verify)", "plan": "triton",
                  "defer": "tests/support/documented_surface.py (_defer_commit_kernel)", "commit": "triton",
                  "flush": "tests/support/documented_surface.py (_prepare_flush_plan_kernel) + triton (commit)"}


@pytest.mark.parametrize("mode", ["stock", "deferred", "mixed"])
def test_documented_surface_module_replays(mode, tmp_path, capsys, monkeypatch):
    """A module with only verify, the records type and the two raw kernels is an
    implementation; the report says which ops ran through it and which through kda."""
    path = make_trace(tmp_path / f"{mode}.safetensors",
                      SynthConfig(preset="tiny", mode=mode, requests=4, seed=7, max_batch=4, max_decode_steps=3))
    code, report, err = _replay_json([str(path), "--impl", "tests/support/documented_surface.py"], capsys, monkeypatch)
    assert code == 0 and report["passed"], err
    assert report["routes"] == SURFACE_ROUTES
    if mode != "stock":
        assert {"defer", "flush"} <= set(report["summary"])
    code, out, err = run_kda(["replay", str(path), "--impl", "tests/support/documented_surface.py", "--no-progress"],
                             capsys, monkeypatch)
    assert code == 0 and "ops through: tests/support/documented_surface.py: verify (kda_recoverssm_verify), defer " \
        "(_defer_commit_kernel), flush (_prepare_flush_plan_kernel); triton: plan, commit, flush (commit)\n" in out, err


def test_documented_surface_with_a_wrong_defer_rule_is_named(capsys, monkeypatch, good):
    """A defer kernel that defers eager rows too: exit 1, at a defer event."""
    code, report, err = _replay_json([str(good), "--impl", "tests/broken_impls/surface_defers_eager.py",
                                      "--stop-at-first"], capsys, monkeypatch)
    assert code == 1 and not report["passed"], err
    bad = [e for e in report["events"] if not e["passed"]]
    assert bad[0]["op"] == "defer"
    first = next(t for t in bad[0]["tensors"] if not t["passed"])
    assert first["role"] in ("commit_lens", "pending")


def test_the_implementations_doc_shows_the_file_the_tests_load():
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    doc = (repo / "docs" / "implementations.md").read_text()
    assert (repo / "tests" / "support" / "documented_surface.py").read_text() in doc
