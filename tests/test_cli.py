"""Conventions every ``kda`` command shares: ``--format``, one ``Error:`` line with exit 2
for usage errors, and a ``--help`` that imports neither torch nor triton."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.trace_helpers import run_kda

REPORTING = [
    ["replay", "t.safetensors"],
    ["info", "t.safetensors"],
    ["synth", "t.safetensors"],
    ["slice", "t.safetensors", "--events", "0:1", "--out", "u.safetensors"],
    ["repro", "t.safetensors", "--out", "bundle"],
    ["bench"],
    ["version"],
    ["record", "merge", "t.safetensors.shards", "t.safetensors"],
    ["record", "run", "t.safetensors", "--format", "xml", "--", "true"],
]


@pytest.mark.parametrize("args", REPORTING, ids=lambda a: " ".join(a[:2]))
def test_every_report_refuses_an_unknown_format_the_same_way(args, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if "--format" not in args:
        args = [*args, "--format", "xml"]
    code, out, err = run_kda(args, capsys, monkeypatch)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == ["Error: --format xml: expected human or json"]


@pytest.mark.parametrize("args, message", [
    (["replay", "--bogus"], "No such option: --bogus"),
    (["info"], "Missing argument"),
    (["nosuch"], "No such command 'nosuch'"),
])
def test_usage_errors_are_one_error_line_and_exit_2(args, message, capsys, monkeypatch):
    code, out, err = run_kda(args, capsys, monkeypatch)
    lines = err.strip().splitlines()
    assert code == 2 and out == ""
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0] and "--help" in lines[0]


def test_version_json(capsys, monkeypatch):
    code, out, _ = run_kda(["version", "--format", "json"], capsys, monkeypatch)
    assert code == 0 and {"kda", "torch", "triton", "gpu"} <= set(json.loads(out))


def test_help_imports_neither_torch_nor_triton():
    probe = ("import sys; sys.argv = ['kda', '--help']\n"
             "from kda_cli.app import main\n"
             "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
             "print(sorted(m for m in ('torch', 'triton', 'numpy', 'safetensors') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_an_unwritable_output_path_is_bad_input(tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    out = blocker / "t.safetensors"
    code, stdout, err = run_kda(["synth", str(out), "--preset", "tiny"], capsys, monkeypatch)
    assert code == 2 and stdout == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "a-file" in lines[0]
    assert "Traceback" not in err and blocker.read_text() == "not a folder"
