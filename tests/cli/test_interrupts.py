"""Ctrl-C and SIGTERM while a command works: one ``Error:`` line naming the signal, the
partial summary where there is one, exit 130 or 143, and no output, temporary file or
temporary folder left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.trace_helpers import make_trace
from traces.format.io import read_trace

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "traces" / "samples" / "k3-tp8-sample.safetensors"
BROKEN = REPO / "tests" / "broken_impls"


def _stopped(args: list[str], started: str, sig: int, cwd: Path, group: bool = False) -> tuple[int, str, list[str]]:
    """Run ``kda ARGS``; send ``sig`` once a stderr line starts with ``started``: to kda, or
    with ``group`` to its process group, as a terminal's Ctrl-C is sent."""
    proc = subprocess.Popen([sys.executable, "-m", "kda_cli", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=group,
                            env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)})
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if line.startswith(started):
                os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
                break
        stdout, rest = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return proc.returncode, stdout, (("".join(seen) + rest).strip().splitlines())


@pytest.mark.parametrize("sig, format", [(signal.SIGINT, "json"), (signal.SIGTERM, "human")],
                         ids=["SIGINT", "SIGTERM"])
def test_replay_prints_the_events_it_compared(sig, format, tmp_path):
    code, stdout, err = _stopped(["replay", str(SAMPLE), "--impl", "reference", "--format", format],
                                 "replay: ", sig, tmp_path)
    assert code == 128 + sig, err
    if format == "json":
        partial = json.loads(stdout)
        assert partial["interrupted"] and 1 <= len(partial["events"]) < 19
        assert partial["passed"] is False  # what was not compared may fail
    else:
        verdict = stdout.strip().splitlines()[-1]
        assert verdict.startswith("STOPPED after ") and verdict.endswith("no mismatch so far"), stdout
    assert err[-1].startswith(f"Error: interrupted by {signal.Signals(sig).name}; ")
    assert "of 19 run; the summary above covers those compared" in err[-1]
    assert not any(line.startswith("Traceback") for line in err)


@pytest.mark.parametrize("args, started, sig", [
    (["synth", "out/t.safetensors", "--preset", "k3-tp8", "--requests", "24", "--max-batch", "4"],
     "synth: requests finished", signal.SIGTERM),
    (["slice", str(SAMPLE), "--events", "14:", "--out", "out/cut.safetensors"], "slice: events run", signal.SIGINT),
    (["repro", "{trace}", "--out", "out/bug", "--impl", str(BROKEN / "flush_consumes_pending.py")], "repro: ",
     signal.SIGTERM),
], ids=["synth", "slice", "repro"])
def test_writers_leave_nothing_behind(args, started, sig, tmp_path):
    trace = make_trace(tmp_path / "t.safetensors")
    (tmp_path / "out").mkdir()
    code, stdout, err = _stopped([a.format(trace=trace) for a in args], started, sig, tmp_path)
    assert code == 128 + sig and stdout == "", err
    assert err[-1].startswith(f"Error: interrupted by {signal.Signals(sig).name}; ")
    assert "nothing written" in err[-1]
    assert not any(line.startswith("Traceback") for line in err)
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("sig, group", [(signal.SIGINT, True), (signal.SIGTERM, False)],
                         ids=["Ctrl-C at a terminal", "SIGTERM to kda"])
def test_a_stopped_recording_is_merged_and_said_in_one_line(sig, group, tmp_path):
    """Ctrl-C reaches kda alone, which stops the command (no traceback of its own), merges
    what it recorded and says so in one ``Error:`` line, exit 130 or 143."""
    program = tmp_path / "loop.py"
    program.write_text("import sys, time\n"
                       f"sys.path.insert(0, {str(REPO)!r})\n"
                       "from tests.support.decode_loop import decode_loop\n"
                       "from traces.record import api\n"
                       "decode_loop(api('reference'), 'stock', steps=2)\n"
                       "print('recorded', file=sys.stderr, flush=True)\n"
                       "time.sleep(120)\n")
    out = tmp_path / "run.safetensors"
    code, stdout, err = _stopped(["record", "run", str(out), "--", sys.executable, str(program)], "recorded", sig,
                                 tmp_path, group=group)
    assert code == 128 + sig, err
    assert not any("Traceback" in line or "KeyboardInterrupt" in line for line in err), err
    with read_trace(out) as trace:
        events = len(trace.events)
    assert events >= 6 and not (tmp_path / "run.safetensors.shards").exists()
    assert stdout.startswith(f"wrote {out}: {events} events (merged from ") and "killed by SIGTERM" in stdout
    assert err[-1] == (f"Error: interrupted by {signal.Signals(sig).name}; the command was stopped; {events} events "
                       f"recorded, in {out}")


def test_an_interrupted_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    """Stopped inside the write itself: the half-written temporary file goes too."""
    import traces.format.io

    def half_then_stop(tensors, path, metadata=None):
        Path(path).write_bytes(b"half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(traces.format.io, "save_file", half_then_stop)
    with pytest.raises(KeyboardInterrupt):
        make_trace(tmp_path / "t.safetensors")
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_bundle_leaves_no_temporary_folder(tmp_path, capsys, monkeypatch):
    """Stopped during the fresh-process check, with the bundle half assembled beside ``--out``."""
    import traces.repro.bundle
    from tests.support.trace_helpers import run_kda

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    trace = make_trace(tmp_path / "t.safetensors")
    (tmp_path / "out").mkdir()
    monkeypatch.setattr(traces.repro.bundle, "_recheck", stop)
    code, out, err = run_kda(["repro", str(trace), "--out", str(tmp_path / "out" / "bug"), "--impl",
                              str(BROKEN / "flush_consumes_pending.py")], capsys, monkeypatch)
    assert code == 130 and out == ""
    assert err.strip().splitlines()[-1].startswith("Error: interrupted by SIGINT; ")
    assert list((tmp_path / "out").iterdir()) == []
