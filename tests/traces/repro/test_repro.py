"""``kda repro`` and ``kda slice``: broken implementations caught by replay, shrunk to a
small bundle that fails the same way in a fresh process; determinism; cutting by hand."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.decode_loop import decode_loop
from tests.support.trace_helpers import run_kda
from traces.format.io import read_trace
from traces.record.recorder import record_trace

BROKEN = Path(__file__).resolve().parents[2] / "broken_impls"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A deferred decode loop whose flushes leave the pending counts (as the documented flush
    plan kernel does) and an align-mode one, recorded through the reference."""
    folder = tmp_path_factory.mktemp("recorded")
    paths = {}
    for mode, steps in (("deferred", 3), ("align", 2)):
        paths[mode] = folder / f"{mode}.safetensors"
        with record_trace(paths[mode], "reference") as api:
            decode_loop(api, mode, steps=steps, consume_pending=False)
    return paths


def _first_failure(report: dict) -> tuple[int, str, str]:
    for e in report["events"]:
        for t in e["tensors"]:
            if not t["passed"]:
                return e["index"], e["op"], t["role"]
    raise AssertionError("no failing tensor")


@pytest.mark.parametrize("mode, broken, op, role", [
    ("deferred", "flush_consumes_pending.py", "flush", "pending"),
    ("align", "old_align_column.py", "plan", "final_state_indices"),
])
def test_broken_implementation_is_caught_and_shrunk(recorded, tmp_path, capsys, monkeypatch, mode, broken, op, role):
    trace, impl = recorded[mode], str(BROKEN / broken)
    code, out, err = run_kda(["replay", str(trace), "--impl", impl, "--format", "json", "--no-progress"],
                             capsys, monkeypatch)
    assert code == 1, err
    assert _first_failure(json.loads(out))[1:] == (op, role)

    bundle = tmp_path / "bundle"
    code, out, err = run_kda(["repro", str(trace), "--out", str(bundle), "--impl", impl, "--format", "json"],
                             capsys, monkeypatch)
    assert code == 1, err
    summary = json.loads(out)
    assert (summary["original"]["op"], summary["original"]["tensor"]) == (op, role)
    assert (summary["shrunk"]["op"], summary["shrunk"]["tensor"]) == (op, role)
    assert summary["fresh_process_exit"] == 1
    assert sorted(p.name for p in bundle.iterdir()) == ["impl", "report.md", "repro.sh", "trace.safetensors"]
    assert [p.name for p in (bundle / "impl").iterdir()] == [broken]
    with read_trace(bundle / "trace.safetensors") as small:
        assert len(small.events) <= 5 and small.events[-1].op == op
        assert max(small.tensor(e.inputs["state_indices"]).shape[0] for e in small.events) <= 2
    report = (bundle / "report.md").read_text()
    for needle in ("## First divergence", f"op `{op}`, tensor `{role}`", "## Environment", "torch", "kda repro"):
        assert needle in report

    done = subprocess.run(["sh", str(bundle / "repro.sh"), "--format", "json", "--no-progress"],
                          capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    assert _first_failure(json.loads(done.stdout))[1:] == (op, role)


def test_implementation_that_raises_is_shrunk_to_the_raising_call(recorded, tmp_path, capsys, monkeypatch):
    bundle = tmp_path / "bundle"
    code, out, err = run_kda(["repro", str(recorded["deferred"]), "--out", str(bundle), "--impl",
                              str(BROKEN / "commit_raises.py"), "--format", "json", "--corpus",
                              str(tmp_path / "corpus")], capsys, monkeypatch)
    assert code == 1, err
    summary = json.loads(out)
    assert summary["shrunk"]["op"] == "commit" and summary["shrunk"]["kind"] == "raised RuntimeError"
    copy = Path(summary["corpus_copy"])
    assert copy.parent == tmp_path / "corpus" and re.fullmatch(r"commit-raised_RuntimeError-[0-9a-f]{8}\.safetensors",
                                                                copy.name)
    assert copy.read_bytes() == (bundle / "trace.safetensors").read_bytes()
    assert summary["shrunk_events"] == 1 and summary["shrunk_rows"] == 1 and summary["fresh_process_exit"] == 3
    done = subprocess.run(["sh", str(bundle / "repro.sh")], capture_output=True, text=True)
    assert done.returncode == 3 and "RuntimeError: illegal memory access" in done.stderr

    # repro.sh runs the Python that wrote it, not whichever python3 comes first on PATH
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text("#!/bin/sh\necho 'No module named kda_cli' >&2\nexit 1\n")
    (fake / "python3").chmod(0o755)
    path = f"{fake}{os.pathsep}{os.environ['PATH']}"
    done = subprocess.run(["sh", str(bundle / "repro.sh")], capture_output=True, text=True,
                          env={**os.environ, "PATH": path})
    assert done.returncode == 3 and "RuntimeError: illegal memory access" in done.stderr
    # a Python that cannot import kda: one line, and an exit status of its own
    (fake / "bare").write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    (fake / "bare").chmod(0o755)
    done = subprocess.run(["sh", str(bundle / "repro.sh")], capture_output=True, text=True,
                          env={**os.environ, "KDA_PYTHON": str(fake / "bare")})
    assert done.returncode == 4 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"repro.sh: {fake / 'bare'} cannot import kda; set KDA_PYTHON to a Python that has it"]

    # the bundle is there: refused again, replaced whole with --force
    (bundle / "report.md").write_text("an earlier report")
    again = ["repro", str(recorded["deferred"]), "--out", str(bundle), "--impl", str(BROKEN / "commit_raises.py")]
    code, out, err = run_kda(again, capsys, monkeypatch)
    assert code == 2 and err.strip().splitlines()[-1] == f"Error: --out {bundle}: is not an empty folder"
    code, out, err = run_kda([*again, "--force"], capsys, monkeypatch)
    assert code == 1 and (bundle / "report.md").read_text().startswith("#"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "bundle", "corpus"]  # nothing left behind


def test_repro_hides_the_interpreters_overflow_warnings(recorded, tmp_path):
    """numpy's RuntimeWarning from the Triton interpreter (an exp overflowing to inf) is noise
    in ``kda repro`` as in ``kda replay``."""
    noisy = tmp_path / "noisy.py"
    noisy.write_text(
        "import warnings\n"
        "from kernels.reference import *  # noqa: F401,F403\n"
        "from kernels import reference\n\n\n"
        "def kda_recoverssm_verify(*args, **kwargs):\n"
        "    warnings.warn_explicit('overflow encountered in exp', RuntimeWarning, 'interpreter.py', 1,\n"
        "                           module='triton.runtime.interpreter')\n"
        "    return reference.kda_recoverssm_verify(*args, **kwargs)\n")
    done = subprocess.run([sys.executable, "-m", "kda_cli", "repro", str(recorded["deferred"]), "--out",
                           str(tmp_path / "bug"), "--impl", str(noisy)], capture_output=True, text=True,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr
    assert "nothing to reproduce" in done.stdout
    assert "RuntimeWarning" not in done.stderr and "overflow" not in done.stderr


def test_passing_trace_writes_no_bundle(recorded, tmp_path, capsys, monkeypatch):
    bundle = tmp_path / "bundle"
    code, out, err = run_kda(["repro", str(recorded["deferred"]), "--out", str(bundle), "--impl", "reference"],
                             capsys, monkeypatch)
    assert code == 0, err
    assert "nothing to reproduce" in out and not bundle.exists()


def test_determinism_reports_a_race(recorded, tmp_path, capsys, monkeypatch):
    args = ["repro", str(recorded["deferred"]), "--out", str(tmp_path / "b"), "--determinism", "3", "--format", "json"]
    code, out, err = run_kda([*args, "--impl", str(BROKEN / "racy_verify.py")], capsys, monkeypatch)
    assert code == 1, err
    runs = json.loads(out)["determinism"]
    assert not runs["deterministic"]
    assert {(d["op"], d["tensor"]) for d in runs["differences"]} == {("verify", "out")}
    assert {d["run"] for d in runs["differences"]} == {1, 2}

    code, out, err = run_kda([*args, "--impl", "reference"], capsys, monkeypatch)
    assert code == 0, err
    assert json.loads(out)["determinism"] == {"runs": 3, "deterministic": True, "differences": [],
                                              "errors": [None, None, None]}


def test_repro_refuses_bad_options(recorded, tmp_path, capsys, monkeypatch):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("")
    for extra, needle in ((["--out", str(busy)], "not an empty folder"),
                          (["--out", str(tmp_path / "o"), "--determinism", "1"], "--determinism"),
                          (["--out", str(tmp_path / "o"), "--impl", "no_such_module"], "--impl")):
        code, out, err = run_kda(["repro", str(recorded["deferred"]), *extra], capsys, monkeypatch)
        assert code == 2 and needle in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_slice_cuts_events_and_replays_exactly(recorded, tmp_path, capsys, monkeypatch):
    out = tmp_path / "cut.safetensors"
    code, stdout, err = run_kda(["slice", str(recorded["deferred"]), "--events", "6:10", "--out", str(out),
                                 "--format", "json"], capsys, monkeypatch)
    assert code == 0, err
    assert json.loads(stdout)["count"] == 4
    with read_trace(out) as cut, read_trace(recorded["deferred"]) as whole:
        assert [e.op for e in cut.events] == [e.op for e in whole.events[6:10]]
        assert cut.manifest.provenance["sliced_events"] == "6:10"
    code, stdout, err = run_kda(["replay", str(out), "--impl", "reference", "--atol", "0", "--rtol", "0",
                                 "--no-progress"], capsys, monkeypatch)
    assert code == 0, stdout + err

    code, stdout, err = run_kda(["slice", str(recorded["deferred"]), "--events", "9:99", "--out",
                                 str(tmp_path / "past.safetensors")], capsys, monkeypatch)
    assert code == 2 and err.startswith("Error:") and "events 0..15" in err


def test_renumbering_and_dropping_a_request_leave_the_other_rows_alone(recorded, tmp_path):
    import kernels.reference
    from traces.repro.shrink import regenerate
    from traces.repro.slice import compact, drop_request
    from traces.format.tape import Tape

    with read_trace(recorded["deferred"]) as trace:
        tape = Tape.load(trace)
    same = regenerate(compact(tape), kernels.reference, tmp_path / "same.safetensors")
    assert len(same.steps) == len(tape.steps)
    for before, after in zip(tape.steps, same.steps):
        for role in ("out", "pending", "commit_lens", "states"):
            if role in before.expected:
                kept = after.expected[role].shape[0]  # record row 3 is never named: renumbering drops it
                assert torch.equal(before.expected[role][:kept], after.expected[role]), (before.op, role)

    smaller = regenerate(compact(drop_request(tape, 2)), kernels.reference, tmp_path / "smaller.safetensors")
    for before, after in zip(tape.steps, smaller.steps):
        assert after.batch == before.batch - 1
        if before.op == "verify":
            qsl, slots = before.inputs["query_start_loc"].tolist(), before.inputs["state_indices"].tolist()
            kept = [t for b, s in enumerate(slots) if s != 2 for t in range(qsl[b], qsl[b + 1])]
            torch.testing.assert_close(after.expected["out"], before.expected["out"][:, kept], rtol=0, atol=1e-6)


def test_a_triton_error_is_the_call_that_raised(recorded, tmp_path, capsys, monkeypatch):
    """Triton's errors (``TritonError``) are not ``RuntimeError``s: the replay still names the
    event that raised, and repro shrinks the trace to that call."""
    impl = str(BROKEN / "commit_out_of_resources.py")
    code, out, err = run_kda(["replay", str(recorded["deferred"]), "--impl", impl, "--no-progress"], capsys,
                             monkeypatch)
    lines = err.strip().splitlines()
    assert code == 3 and out == "" and len(lines) == 1, err
    assert re.fullmatch(r"Error: \S+ failed at event \d+ \(commit\): OutOfResources: out of resource: shared memory.*",
                        lines[0]), lines[0]
    code, out, err = run_kda(["repro", str(recorded["deferred"]), "--out", str(tmp_path / "bundle"), "--impl", impl,
                              "--format", "json"], capsys, monkeypatch)
    assert code == 1, err
    summary = json.loads(out)
    assert summary["shrunk"]["op"] == "commit" and summary["shrunk"]["kind"] == "raised OutOfResources"
    assert summary["shrunk_events"] == 1 and summary["fresh_process_exit"] == 3


@pytest.mark.parametrize("command", ["slice", "repro"])
def test_an_oracle_that_cannot_be_loaded_is_named_as_the_oracle(recorded, tmp_path, capsys, monkeypatch, command):
    trace = str(recorded["deferred"])
    args = {"slice": ["slice", trace, "--events", "1:2", "--out", str(tmp_path / "cut.safetensors")],
            "repro": ["repro", trace, "--out", str(tmp_path / "bundle"), "--impl",
                      str(BROKEN / "flush_consumes_pending.py")]}[command]
    code, out, err = run_kda([*args, "--oracle", "no_such_oracle"], capsys, monkeypatch)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith("Error: --oracle no_such_oracle: cannot import it"), lines[0]
    assert list(tmp_path.iterdir()) == []


def test_a_failure_only_the_final_buffers_show_is_shrunk(tmp_path, capsys, monkeypatch):
    """Records written past a row's window: no event compares them, the final buffers do.
    Candidates get the oracle's final buffers too, so the trace shrinks and the bundle fails
    the same way in a fresh process."""
    from traces.synth.simulation import SynthConfig, synthesize

    trace = tmp_path / "synth.safetensors"
    synthesize(SynthConfig(mode="stock", requests=6, max_batch=4, seed=1)).write(trace)
    code, out, err = run_kda(["repro", str(trace), "--out", str(tmp_path / "bundle"), "--impl",
                              str(BROKEN / "verify_writes_past_the_window.py"), "--format", "json"], capsys, monkeypatch)
    assert code == 1, err
    summary = json.loads(out)
    assert (summary["original"]["op"], summary["original"]["tensor"]) == ("final", "records.correction")
    assert (summary["shrunk"]["op"], summary["shrunk"]["tensor"]) == ("final", "records.correction")
    assert summary["shrunk_events"] <= 3 < summary["original"]["event"] and summary["fresh_process_exit"] == 1
    assert "regenerated by the oracle implementation" in (tmp_path / "bundle" / "report.md").read_text()


@pytest.mark.parametrize("name", ["noisy_kernels.py", "kernels.py"])
def test_a_bundle_survives_an_implementation_that_prints_or_is_named_kernels(recorded, tmp_path, capsys, monkeypatch,
                                                                          name):
    """An implementation that prints (at import and in its calls) leaves ``--format json``
    stdout one JSON document, and one whose file is ``kernels.py`` does not hide kda's
    ``kernels`` in the bundle: both bundles fail the same way in a fresh process."""
    source = (BROKEN / "flush_consumes_pending.py").read_text()
    impl = tmp_path / "my impl" / name
    impl.parent.mkdir()
    impl.write_text('print("loading my kernels")\n' + source.replace(
        "    _prepare_flush_plan(", "    print('flushing')\n    _prepare_flush_plan("))
    code, out, err = run_kda(["replay", str(recorded["deferred"]), "--impl", str(impl), "--format", "json",
                              "--no-progress"], capsys, monkeypatch)
    assert code == 1, (out[:300], err[:300])
    assert _first_failure(json.loads(out))[1:] == ("flush", "pending")
    assert "loading my kernels" in err and "flushing" in err
    bundle = tmp_path / "bundle"
    code, out, err = run_kda(["repro", str(recorded["deferred"]), "--out", str(bundle), "--impl", str(impl),
                              "--format", "json"], capsys, monkeypatch)
    assert code == 1, err
    assert json.loads(out)["fresh_process_exit"] == 1 and (bundle / "impl" / name).is_file()
    assert "--impl impl/" + name in (bundle / "repro.sh").read_text()


def test_repro_sh_sets_the_design_the_run_forced(recorded, tmp_path, capsys, monkeypatch):
    """A failure may need the design ``KDA_DESIGN`` forced: the bundle runs under it too."""
    monkeypatch.setenv("KDA_DESIGN", "verify=one-pass")
    bundle = tmp_path / "bundle"
    code, out, err = run_kda(["repro", str(recorded["deferred"]), "--out", str(bundle), "--impl",
                              str(BROKEN / "flush_consumes_pending.py")], capsys, monkeypatch)
    assert code == 1, err
    assert "export KDA_DESIGN=verify=one-pass\n" in (bundle / "repro.sh").read_text()
    assert "`KDA_DESIGN=verify=one-pass` (set by `repro.sh`)" in (bundle / "report.md").read_text()


def test_the_current_folder_is_not_a_bundle_folder(recorded, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_kda(["repro", str(recorded["deferred"]), "--out", ".", "--impl",
                              str(BROKEN / "flush_consumes_pending.py")], capsys, monkeypatch)
    assert code == 2 and err.strip().splitlines() == ["Error: --out .: is the current folder; name a new or empty one"]
    assert list(tmp_path.iterdir()) == []


def test_a_module_of_the_current_folder_goes_into_the_bundle(recorded, tmp_path, capsys, monkeypatch):
    """``--impl cwd_engine`` imports from the current folder, which the bundle's fresh
    process does not run in: its file is copied in."""
    shutil.copyfile(BROKEN / "flush_consumes_pending.py", tmp_path / "cwd_engine.py")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = run_kda(["repro", str(recorded["deferred"]), "--out", "bundle", "--impl", "cwd_engine"],
                             capsys, monkeypatch)
    assert code == 1, err
    assert (tmp_path / "bundle" / "impl" / "cwd_engine.py").is_file()
    assert "--impl impl/cwd_engine.py" in (tmp_path / "bundle" / "repro.sh").read_text()
