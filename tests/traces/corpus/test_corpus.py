"""``kda replay`` of a corpus: 20 tiny traces (17 passing, one mismatching, one damaged, one
whose implementation ends its worker process) through a local pool of two workers and a
local Ray instance; the per-trace lines, summary, JUnit XML, JSON and exit code; Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kda_cli.runtime import cuda_available
from tests.support.trace_helpers import TINY, first_event, make_trace, rewrite, run_kda
from traces.corpus.run import device_label
from traces.corpus.pool import worker_devices
from traces.synth.config import SynthConfig

REPO = Path(__file__).resolve().parents[3]
CRASHING = REPO / "tests" / "broken_impls" / "exits_on_nine_slots.py"
DEVICE = "cuda" if cuda_available() else "cpu"
PASSING = 17
EXPECTED = {**{f"pass-{i:02d}.safetensors": "passed" for i in range(PASSING)},
            "mismatch.safetensors": "mismatch", "damaged.safetensors": "refused", "crash.safetensors": "crashed"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The 20-trace folder of ``EXPECTED``: copies of two synthesised traces, one with an
    expected output perturbed, one cut short, and one with the nine-slot pool that
    ``exits_on_nine_slots.py`` crashes on."""
    work = tmp_path_factory.mktemp("sources")
    folder = tmp_path_factory.mktemp("corpus")
    sources = [make_trace(work / "a.safetensors"), make_trace(work / "b.safetensors", SynthConfig(
        **{**TINY.__dict__, "seed": 4}))]
    for i in range(PASSING):
        shutil.copy(sources[i % 2], folder / f"pass-{i:02d}.safetensors")

    def perturb(manifest, tensors):
        name = manifest["events"][first_event(manifest, "verify", "out")]["expected"]["out"]
        tensors[name] = tensors[name] + 1.0

    rewrite(sources[0], folder / "mismatch.safetensors", perturb)
    data = sources[0].read_bytes()
    (folder / "damaged.safetensors").write_bytes(data[: len(data) // 2])
    make_trace(folder / "crash.safetensors", SynthConfig(**{**TINY.__dict__, "num_slots": 9}))
    return folder


def _outcomes(document: dict) -> dict[str, str]:
    return {Path(t["trace"]).name: t["outcome"] for t in document["traces"]}


def _check_json(document: dict, folder: Path) -> None:
    assert _outcomes(document) == EXPECTED
    assert [t["trace"] for t in document["traces"]] == sorted(str(p) for p in folder.iterdir())
    summary = document["summary"]
    assert {k: summary[k] for k in ("passed", "mismatch", "refused", "raised", "crashed", "not_run", "traces")} == \
        {"passed": PASSING, "mismatch": 1, "refused": 1, "raised": 0, "crashed": 1, "not_run": 0, "traces": 20}
    assert document["exit_code"] == 3 and not document["interrupted"]
    by_name = {Path(t["trace"]).name: t for t in document["traces"]}
    mismatch = by_name["mismatch.safetensors"]
    assert mismatch["exit_code"] == 1 and mismatch["report"]["passed"] is False
    assert mismatch["report"]["failing"] == 1 and "events" not in mismatch["report"]
    [bad] = mismatch["report"]["first_failing"]
    assert (bad["role"], bad["mismatches"], bad["first_bad"]["op"]) == ("out", bad["compared"], "verify")
    assert "elements beyond atol=" in mismatch["message"] and "first at event=0 op=verify tensor=out " in \
        mismatch["message"]
    assert "truncated" in by_name["damaged.safetensors"]["message"]
    assert "worker process exited with status 1" in by_name["crash.safetensors"]["message"] or \
        "Ray task failed" in by_name["crash.safetensors"]["message"]
    assert all(by_name[f"pass-{i:02d}.safetensors"]["report"]["passed"] for i in range(PASSING))
    assert summary["slowest"]["seconds"] == max(t["seconds"] for t in document["traces"])


def _check_junit(path: Path, folder: Path) -> None:
    suite = ET.parse(path).getroot()
    assert suite.tag == "testsuite" and suite.get("name") == "kda replay"
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("20", "1", "2", "0")
    cases = {Path(c.get("name")).name: c for c in suite.iter("testcase")}
    assert set(cases) == set(EXPECTED) and all(float(c.get("time")) > 0 for c in cases.values())
    failure = cases["mismatch.safetensors"].find("failure")
    assert failure is not None and failure.get("type") == "mismatch" and "op=verify tensor=out" in failure.get("message")
    for name, kind in (("damaged.safetensors", "refused"), ("crash.safetensors", "crashed")):
        error = cases[name].find("error")
        assert error is not None and error.get("type") == kind and error.get("message")
    assert all(len(cases[name]) == 0 for name, outcome in EXPECTED.items() if outcome == "passed")


def test_a_local_pool_reports_every_trace(corpus, tmp_path, capsys, monkeypatch):
    junit = tmp_path / "report.xml"
    code, out, err = run_kda(["replay", str(corpus), "--impl", str(CRASHING), "--workers", "2",
                              "--junit-xml", str(junit)], capsys, monkeypatch)
    assert code == 3, err
    lines = out.splitlines()
    streamed = {Path(line.split()[1]).name: line.split()[0] for line in lines[:20]}
    assert streamed == {name: {"passed": "PASS", "mismatch": "FAIL", "refused": "REFUSED", "crashed": "CRASHED"}[o]
                        for name, o in EXPECTED.items()}
    assert {re.search(r" \(\d+\.\d\d s, (\S+)\)", line).group(1) for line in lines[:20]} == \
        {label for label, _ in worker_devices(2, DEVICE)}
    assert lines[20] == f"20 traces through {device_label(DEVICE)}, 2 workers"
    table = "\n".join(lines[21:])
    for label, n in (("passed", PASSING), ("failed (mismatch 1, raised 0, crashed 1)", 2),
                     ("refused (damaged or unreadable)", 1)):
        assert f"│ {label} " in table and f"│ {n:>6} │" in table.split(label)[1].splitlines()[0]
    assert lines[-1] == "FAIL: 2 failed and 1 refused of 20 traces"
    assert lines[-2].startswith("time: ") and "; slowest " in lines[-2]
    _check_junit(junit, corpus)

    # one worker: the traces after the crash (the first, in sorted order) need the fresh one
    code, out, err = run_kda(["replay", str(corpus), "--impl", str(CRASHING), "--workers", "1", "--format", "json"],
                             capsys, monkeypatch)
    assert code == 3, err
    document = json.loads(out)
    _check_json(document, corpus)
    assert document["traces"][0]["trace"].endswith("crash.safetensors") and document["workers"] == 1
    assert len([line for line in err.splitlines() if line.startswith(("PASS ", "FAIL ", "REFUSED ", "CRASHED "))]) == 20


def test_a_local_ray_instance_reports_every_trace(corpus, tmp_path, capsys, monkeypatch):
    pytest.importorskip("ray")
    junit = tmp_path / "report.xml"
    code, out, err = run_kda(["replay", str(corpus), "--impl", str(CRASHING), "--ray", "local", "--workers", "2",
                              "--ray-ship", "--format", "json", "--junit-xml", str(junit)], capsys, monkeypatch)
    assert code == 3, err
    document = json.loads(out)
    _check_json(document, corpus)
    assert document["where"] == f"ray local, {device_label(DEVICE)}"
    import torch

    assert document["workers"] == (torch.cuda.device_count() if DEVICE == "cuda" else 2)  # GPUs, else the CPUs asked
    _check_junit(junit, corpus)


def test_without_ray_the_command_says_how_to_install_it(corpus, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    code, out, err = run_kda(["replay", str(corpus), "--ray", "auto"], capsys, monkeypatch)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == ["Error: --ray needs Ray, which is not installed: "
                                        "pip install 'kda-recoverssm[ray]'"]


@pytest.mark.parametrize("args, message", [
    (["{corpus}", "--workers", "0"], "--workers 0: must be at least 1"),
    (["{corpus}", "--events", "1:2"], "--events selects events of one trace; a corpus replays every event"),
    (["{corpus}", "{corpus}/missing.safetensors"], "{corpus}/missing.safetensors: no such file or folder"),
    (["{empty}"], "{empty}: the folder holds no *.safetensors file"),
    (["--workers", "2"], "--workers, --junit-xml and --ray replay a corpus: name its traces or folders"),
    (["{corpus}", "--ray-ship"], "--ray-ship ships traces to Ray tasks; it needs --ray"),
], ids=["workers", "events", "missing", "empty", "no-traces", "ship-without-ray"])
def test_bad_corpus_arguments_are_one_error_line(corpus, tmp_path, capsys, monkeypatch, args, message):
    (tmp_path / "empty").mkdir()
    names = {"corpus": corpus, "empty": tmp_path / "empty"}
    code, out, err = run_kda(["replay", *[a.format(**names) for a in args]], capsys, monkeypatch)
    assert (code, out) == (2, "")
    assert err.strip().splitlines() == [f"Error: {message.format(**names)}"]


def test_an_existing_junit_report_is_refused_unless_forced(tmp_path, capsys, monkeypatch):
    """A CI job's second run: the refusal names ``--force``, which replay has and which
    overwrites the report."""
    trace = make_trace(tmp_path / "t.safetensors", SynthConfig(**{**TINY.__dict__, "requests": 2}))
    junit = tmp_path / "replay.xml"
    junit.write_text("an earlier report")
    args = ["replay", str(trace), "--impl", "reference", "--workers", "1", "--junit-xml", str(junit)]
    code, out, err = run_kda(args, capsys, monkeypatch)
    assert (code, out) == (2, "") and err.strip().splitlines() == [f"Error: --junit-xml {junit}: exists (--force "
                                                                   "overwrites it)"]
    assert junit.read_text() == "an earlier report"
    code, out, err = run_kda([*args, "--force"], capsys, monkeypatch)
    assert code == 0, err
    suite = ET.parse(junit).getroot()
    assert (suite.tag, suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("testsuite", "1", "0", "0")


def test_a_file_named_twice_runs_once(corpus):
    from traces.corpus.run import find_traces

    one = corpus / "pass-00.safetensors"
    assert find_traces([one, corpus])[0] == one and len(find_traces([one, corpus])) == 20


def test_ctrl_c_stops_every_worker_and_prints_the_partial_summary(corpus, tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    slow = tmp_path / "slow.py"
    slow.write_text("import os, time\n"
                    "from kernels.reference import *\n"
                    "from kernels.reference import kda_recoverssm_verify as _verify\n"
                    f"open(os.path.join({str(pids)!r}, str(os.getpid())), 'w').close()\n"
                    "def kda_recoverssm_verify(*args, **kwargs):\n"
                    "    time.sleep(0.2)\n"
                    "    return _verify(*args, **kwargs)\n")
    junit = tmp_path / "report.xml"
    proc = subprocess.Popen([sys.executable, "-m", "kda_cli", "replay", str(corpus), "--impl", str(slow),
                             "--workers", "2", "--junit-xml", str(junit)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)})
    def workers() -> list[int]:
        return [int(p.name) for p in pids.iterdir() if int(p.name) != proc.pid]  # the parent loads it too

    try:
        first = proc.stdout.readline()
        deadline = time.monotonic() + 60
        while len(workers()) < 2 and time.monotonic() < deadline:  # both workers busy
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert first.startswith(("PASS ", "FAIL ", "REFUSED ")), first
    lines = (first + rest).splitlines()
    done = int(lines[-1].split()[2])
    assert 1 <= done < 20 and lines[-1].startswith(f"STOPPED after {done} of 20 traces: ")
    assert any(line.startswith("│ not run (interrupted) ") and line.rstrip().endswith(f"{20 - done:>6} │")
               for line in lines)
    assert err.strip().splitlines()[-1] == \
        f"Error: interrupted by SIGINT; {done} of 20 traces replayed; the summary above covers those"
    assert ET.parse(junit).getroot().get("skipped") == str(20 - done)
    started = workers()
    assert len(started) == 2
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(Path(f"/proc/{pid}").exists() for pid in started)


def test_repro_adds_a_trace_to_the_corpus_once(corpus, tmp_path):
    from traces.repro.reproduction import add_to_corpus
    from traces.repro.shrink import Signature

    trace = corpus / "mismatch.safetensors"
    signature = Signature("verify", "out", "mismatch")
    copy = add_to_corpus(trace, tmp_path / "new" / "corpus", signature)
    assert re.fullmatch(r"verify-out-mismatch-[0-9a-f]{8}\.safetensors", copy.name)
    assert copy.read_bytes() == trace.read_bytes()
    copy.write_bytes(b"kept")
    with pytest.raises(FileExistsError, match="the corpus holds this trace already; not overwritten"):
        add_to_corpus(trace, copy.parent, signature)
    assert copy.read_bytes() == b"kept" and [p.name for p in copy.parent.iterdir()] == [copy.name]


def test_junit_holds_names_and_messages_xml_cannot(tmp_path):
    from traces.corpus.run import CorpusRun, TraceResult
    from traces.corpus.junit import write_junit

    name = "corpus/esc\x1b[31m\u2028.safetensors"
    run = CorpusRun([name, "corpus/later.safetensors"], 1, "cpu", interrupted=True,
                    results=[TraceResult(name, "raised", 0.5, "triton failed at event 3 (verify): \x00bad\x07")])
    write_junit(tmp_path / "r.xml", run)
    suite = ET.parse(tmp_path / "r.xml").getroot()
    first, later = suite.iter("testcase")
    assert first.get("name") == "corpus/esc\\x1b[31m\u2028.safetensors"
    assert first.find("error").get("message") == "triton failed at event 3 (verify): \\x00bad\\x07"
    assert later.find("skipped") is not None and suite.get("skipped") == "1" and suite.get("errors") == "1"


def test_each_worker_is_pinned_to_one_visible_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert worker_devices(None, "cuda") == [("cuda:2", {"CUDA_VISIBLE_DEVICES": "2"}),
                                            ("cuda:3", {"CUDA_VISIBLE_DEVICES": "3"})]
    assert [label for label, _ in worker_devices(3, "cuda")] == ["cuda:2", "cuda:3", "cuda:2"]
    assert len(worker_devices(None, "cpu")) == len(os.sched_getaffinity(0))
    assert worker_devices(1, "cpu") == [("cpu#0", {"TRITON_INTERPRET": "1"})]
