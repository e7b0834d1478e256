"""Conventions every ``kda`` command shares: ``--format``, one ``Error:`` line with exit 2
for usage errors, and a ``--help`` that imports neither torch nor triton."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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


REPO = Path(__file__).resolve().parent.parent


def _kda(*args: str, env: dict | None = None, cwd: Path = REPO, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kda_cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "NO_COLOR": "1", **(env or {})})


def _one_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    return lines[0]


@pytest.mark.parametrize("args, needle", [
    (["bench", "--preset", "huge"], "unknown preset huge"),
    (["synth", "x.safetensors", "--preset", "huge"], "--preset huge: expected one of"),
    (["replay", "--events", "30:10"], "--events 30:10: the range is empty (A must be less than B)"),
    (["slice", "t.safetensors", "--events", "x", "--out", "u.safetensors"], "--events x: expected A:B"),
    (["replay", "--events", "a:b"], "--events a:b: expected A:B"),  # printed as given, no emoji
    (["replay", "--rtol", "inf"], "--rtol inf: must be a finite number >= 0"),  # inf * 0 would fail exact zeros
    (["synth", "x.safetensors", "--seed", "-1"], "--seed -1: expected an integer >= 0"),
    (["bench", "--row-seconds", "nan"], "--row-seconds nan: expected a positive, finite number of seconds"),
    (["repro", "t.safetensors", "--out", "b", "--determinism", "1"], "--determinism 1"),
])
def test_argument_errors_come_before_torch_is_imported(args, needle, tmp_path):
    """A bad argument is refused from the arguments alone: one line, exit 2, torch never loaded."""
    probe = (f"import sys; sys.argv = ['kda', *{args!r}]\n"
             "from kda_cli.app import main\n"
             "try:\n    main()\nexcept SystemExit as exc:\n"
             "    print('torch' in sys.modules, exc.code)\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)})
    assert done.stdout.split() == ["False", "2"], done.stdout + done.stderr
    assert needle in _one_error(done.stderr)


def _commands():
    import typer.main

    from kda_cli.app import app

    root = typer.main.get_command(app)
    stack = [(name, cmd) for name, cmd in root.commands.items()]
    while stack:
        name, cmd = stack.pop()
        if hasattr(cmd, "commands"):
            stack += [(f"{name} {sub}", c) for sub, c in cmd.commands.items()]
        else:
            yield name, cmd


def test_boolean_options_are_flags_in_every_command_and_its_help():
    """A bool option takes no value, and its help shows the flag alone (no ``<bool>``/BOOLEAN);
    no help shows a Python type or ``None``."""
    seen = 0
    for name, cmd in _commands():
        for param in cmd.params:
            if getattr(param, "is_bool_flag", False) or getattr(param, "type", None) is not None and \
                    getattr(param.type, "name", "") == "boolean":
                seen += 1
                assert param.is_flag, f"{name} {param.opts}"
        help_text = _kda(*name.split(), "--help").stdout
        assert "<bool>" not in help_text and "BOOLEAN" not in help_text, help_text
        assert "list[" not in help_text and "None" not in help_text, help_text
    assert seen >= 4  # replay --stop-at-first, --progress; bench --eager, --interpreter-smoke


def test_no_command_module_imports_the_app():
    for path in (REPO / "kda_cli" / "commands").glob("*.py"):
        text = path.read_text()
        assert "kda_cli.app" not in text.replace("``kda_cli.app``", ""), path


def test_no_module_of_the_tool_is_long():
    for folder in ("kda_cli", "traces"):
        for path in (REPO / folder).rglob("*.py"):
            assert len(path.read_text().splitlines()) <= 450, path


@pytest.mark.parametrize("args, needle", [
    (["synth", "{missing}/t.safetensors"], "does not exist (create it first)"),
    (["synth", "{folder}"], "is a folder; name a file"),
    (["slice", "{trace}", "--events", "0:1", "--out", "{missing}/deep/cut.safetensors"], "does not exist"),
    (["repro", "{trace}", "--out", "{missing}/deep/bug"], "does not exist"),
    (["bench", "--interpreter-smoke", "--save", "{missing}/run.json"], "--save"),
    (["bench", "--interpreter-smoke", "--plot", "{folder}"], "--plot"),
    (["record", "merge", "{folder}", "{missing}/t.safetensors"], "does not exist"),
])
def test_output_paths_are_checked_before_any_work_and_nothing_is_created(args, needle, tmp_path):
    """Refused at once (no progress line, exit 2, one line); no folder appears."""
    folder = tmp_path / "folder"
    folder.mkdir()
    trace = tmp_path / "t.safetensors"
    trace.write_bytes(b"")
    names = {"missing": str(tmp_path / "missing"), "folder": str(folder), "trace": str(trace)}
    done = _kda(*(a.format(**names) for a in args))
    assert done.returncode == 2 and done.stdout == ""
    assert needle in _one_error(done.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "t.safetensors"]
    assert not any(folder.iterdir())


def test_long_work_reports_progress_outside_a_terminal(tmp_path):
    out = tmp_path / "t.safetensors"
    done = _kda("synth", str(out), "--requests", "3")
    assert done.returncode == 0, done.stderr
    assert "synth: requests finished: " in done.stderr and "/3" in done.stderr
    assert done.stdout.startswith(f"wrote {out}: ") and out.is_file()


def test_human_output_has_no_python_reprs(tmp_path, capsys, monkeypatch):
    from kda_cli.output import human_value, plural

    assert human_value(["verify", "plan"]) == "verify, plan"
    assert [human_value(v) for v in (None, "", {}, [], True)] == ["none", "none", "none", "none", "yes"]
    assert human_value({"verify": 2, "plan": None}) == "verify 2, plan none"
    assert (plural(1, "event"), plural(2, "event")) == ("1 event", "2 events")
    out = tmp_path / "t.safetensors"
    code, stdout, err = run_kda(["synth", str(out), "--requests", "1", "--steps", "1"], capsys, monkeypatch)
    assert code == 0, err
    code, stdout, err = run_kda(["info", str(out)], capsys, monkeypatch)
    assert code == 0, err
    for repr_text in ("None", "['", "{'", "--steps None"):
        assert repr_text not in stdout, stdout


def test_replay_explains_ops_without_recorded_results(capsys):
    """The sample's commits carry no expected results: the per-op row says 0 tensors, and a
    line says why instead of leaving ``commit 4 0 0 n/a`` unexplained."""
    from kda_cli.commands.replay import _render
    from traces.replay.compare import DEFAULT_TOLERANCES
    from traces.replay.engine import EventReport, ReplayReport
    from traces.format.schema import BufferSizes, Dims, Manifest

    report = ReplayReport("t.safetensors", "reference", "cpu", dict(DEFAULT_TOLERANCES), event_range=(0, 4),
                          events=[EventReport(i, "commit", [], None) for i in range(4)])
    manifest = Manifest(Dims(H=2, K=16, V=16, T=4), "bfloat16", "float32", -5.0, BufferSizes(2, 2, 2), {}, {})
    manifest.events = []
    _render(report, manifest)
    out = capsys.readouterr().out
    assert "commit: 4 events with no recorded results; they ran, to carry the buffers forward, but there was " \
           "nothing to compare" in out


def test_one_triton_version_the_tested_series_is_pinned():
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    tritons = [d for d in project["dependencies"] if d.startswith("triton")]
    assert tritons == ["triton>=3.6.0,<3.7"]
    assert not [d for extra in project["optional-dependencies"].values() for d in extra if d.startswith("triton")]
    assert project["name"] == "kda-recoverssm" and project["scripts"] == {"kda": "kda_cli.app:main"}


def test_a_package_shadowing_kernels_is_named_in_one_error_line(tmp_path):
    """Another installed ``kernels`` ahead on the path: one line naming it and the fix, exit 3."""
    site = tmp_path / "site"
    (site / "kernels").mkdir(parents=True)
    (site / "kernels" / "__init__.py").write_text("")
    (site / "kernels-0.4.dist-info").mkdir()
    (site / "kernels-0.4.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: kernels\nVersion: 0.4\n")
    (site / "kernels-0.4.dist-info" / "top_level.txt").write_text("kernels\n")
    done = _kda("version", env={"PYTHONPATH": f"{site}{os.pathsep}{REPO}"}, cwd=tmp_path)
    assert done.returncode == 3 and done.stdout == ""
    line = _one_error(done.stderr)
    assert "'kernels'" in line and "the installed package kernels" in line and "pip uninstall kernels" in line
    assert "own environment" in line


@pytest.mark.parametrize("value, named", [("verify=warp-speed", "'warp-speed'"), ("nonsense=token-loop", "'nonsense'")])
def test_a_bad_forced_design_is_bad_input_before_any_work(value, named, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KDA_DESIGN", value)
    code, out, err = run_kda(["replay", "--format", "json"], capsys, monkeypatch)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: KDA_DESIGN: unknown") and named in lines[0]
