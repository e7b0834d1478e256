"""Conventions every ``kda`` command shares: ``--format``, one ``Error:`` line with exit 2
for usage errors, and a ``--help`` that imports neither torch nor triton."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.trace_helpers import run_kda

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
    (["slice"], "Missing argument"),
    (["nosuch"], "No such command 'nosuch'"),
])
def test_usage_errors_are_one_error_line_and_exit_2(args, message, capsys, monkeypatch):
    code, out, err = run_kda(args, capsys, monkeypatch)
    lines = err.strip().splitlines()
    assert code == 2 and out == ""
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0] and "--help" in lines[0]


def test_info_defaults_to_the_shipped_sample_as_replay_does(capsys, monkeypatch):
    code, out, err = run_kda(["info", "--format", "json"], capsys, monkeypatch)
    assert code == 0, err
    summary = json.loads(out)
    assert Path(summary["path"]).name == "k3-tp8-sample.safetensors" and summary["events"] == 19
    assert summary["dims"] == {"H": 12, "K": 128, "V": 128, "T": 8}


@pytest.mark.parametrize("short, full", [("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", "float32"),
                                         ("fp64", "float64")])
def test_one_dtype_vocabulary_for_tolerances_and_the_bench_state(short, full):
    """``--atol``/``--rtol`` and ``kda bench --state-dtype`` take the same names, short or full."""
    from kda_cli.options import parse_tolerances
    from traces.bench.config import BenchConfig

    for name in (short, full):
        table = parse_tolerances([f"{name}=0.5"], [f"{name}=0.25"])
        assert (table[full].atol, table[full].rtol) == (0.5, 0.25)
        if full in ("float32", "bfloat16"):
            assert BenchConfig(state_dtype=name).state_dtype == full
        else:
            with pytest.raises(ValueError, match=r"one of float32 \(fp32\), bfloat16 \(bf16\), got " + name):
                BenchConfig(state_dtype=name)


def test_an_unknown_tolerance_dtype_lists_both_spellings(capsys, monkeypatch):
    code, out, err = run_kda(["replay", "--atol", "half=1"], capsys, monkeypatch)
    assert code == 2 and err.strip().splitlines() == [
        "Error: --atol half=1: unknown dtype 'half' (one of float64 (fp64), float32 (fp32), float16 (fp16), "
        "bfloat16 (bf16))"]


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


REPO = Path(__file__).resolve().parents[2]


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


@pytest.mark.parametrize("args, option", [
    (["synth", "{old}"], "OUT"),
    (["slice", "{trace}", "--events", "0:1", "--out", "{old}"], "--out"),
    (["record", "merge", "{folder}", "{old}"], "OUT"),
    (["record", "run", "{old}", "--", "true"], "OUT"),
    (["bench", "--interpreter-smoke", "--save", "{old}"], "--save"),
    (["bench", "--interpreter-smoke", "--plot", "{old}"], "--plot"),
])
def test_every_writer_refuses_an_existing_output_unless_forced(args, option, tmp_path):
    """Before any work: one line, exit 2, the file as it was; ``--force`` is what overwrites."""
    (tmp_path / "folder").mkdir()
    old = tmp_path / "old.safetensors"
    old.write_text("an earlier result")
    trace = tmp_path / "t.safetensors"
    trace.write_bytes(b"")
    done = _kda(*(a.format(old=old, trace=trace, folder=tmp_path / "folder") for a in args))
    assert done.returncode == 2 and done.stdout == ""
    assert _one_error(done.stderr) == f"Error: {option} {old}: exists (--force overwrites it)"
    assert old.read_text() == "an earlier result"


@pytest.mark.parametrize("args, option", [
    (["synth", "{out}"], "OUT"),
    (["slice", "{trace}", "--events", "0:1", "--out", "{out}"], "--out"),
    (["record", "merge", "{folder}", "{out}"], "OUT"),
    (["record", "run", "{out}", "--", "true"], "OUT"),
])
def test_a_trace_is_written_only_to_a_safetensors_name(args, option, tmp_path, capsys, monkeypatch):
    """A corpus folder is scanned for ``*.safetensors``: a trace named ``out.txt`` would be
    skipped there, so it is refused before any work, naming the suffix."""
    (tmp_path / "folder").mkdir()
    trace = tmp_path / "t.safetensors"
    trace.write_bytes(b"")
    out = tmp_path / "out.txt"
    names = {"out": out, "trace": trace, "folder": tmp_path / "folder"}
    code, stdout, err = run_kda([a.format(**names) for a in args], capsys, monkeypatch)
    assert (code, stdout) == (2, "") and not out.exists()
    assert err.strip().splitlines() == [f"Error: {option} {out}: a trace file's name ends in .safetensors (a corpus "
                                        "folder is scanned for *.safetensors alone)"]


def test_force_overwrites_and_repro_replaces_only_a_bundle(tmp_path, capsys, monkeypatch):
    from kda_cli.options import output_folder
    from kda_cli.runtime import CommandError
    from traces.repro.bundle import is_bundle

    out = tmp_path / "t.safetensors"
    out.write_text("an earlier result")
    code, stdout, err = run_kda(["synth", str(out), "--requests", "1", "--steps", "1", "--force"], capsys, monkeypatch)
    assert code == 0 and stdout.startswith(f"wrote {out}: "), err
    bundle, other = tmp_path / "bug", tmp_path / "notes"
    for folder, names in ((bundle, ("trace.safetensors", "report.md", "repro.sh")), (other, ("repro.sh", "todo.txt"))):
        folder.mkdir()
        for name in names:
            (folder / name).write_text("x")
    assert is_bundle(bundle) and not is_bundle(other)
    output_folder(bundle, "--out", replaceable=is_bundle)
    for replaceable, said in ((None, "is not an empty folder"),
                              (is_bundle, "is not an empty folder; --force replaces only an earlier bundle")):
        with pytest.raises(CommandError, match=f"--out {other}: {said}$"):
            output_folder(other, "--out", replaceable=replaceable)
    done = _kda("repro", str(out), "--out", str(other), "--force")
    assert done.returncode == 2 and _one_error(done.stderr).endswith("--force replaces only an earlier bundle")


def test_progress_shows_the_time_left_from_the_weights_done(monkeypatch, capsys):
    import kda_cli.output as output

    clock = iter([100.0, 100.0, 110.0])
    monkeypatch.setattr(output.time, "monotonic", lambda: next(clock))
    with output.Progress("replay", 3, terminal=False, weights=[1.0, 3.0, 0.0]) as bar:
        bar.update(1)  # 10 s for a weight of 1: 3 to go
    assert capsys.readouterr().err == "replay: 1/3, about 30 s left\n"
    assert [output.duration(s) for s in (0.2, 89, 91, 5300, 5401)] == ["1 s", "89 s", "2 min", "88 min", "1 h 30 min"]


def test_an_interpreter_replay_says_how_long_before_it_starts_and_what_is_left(tmp_path):
    """Before the first event: an estimate from the trace's sizes, and the reference hint for
    a long run; then the time left."""
    sample = REPO / "traces" / "samples" / "k3-tp8-sample.safetensors"
    proc = subprocess.Popen([sys.executable, "-m", "kda_cli", "replay", str(sample), "--format", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""})
    try:
        first = proc.stderr.readline()
    finally:
        proc.kill()
        proc.communicate()
    assert re.fullmatch(r"replay: 19 events through the Triton interpreter \(no CUDA device\): roughly \d+ s on a "
                        r"2-core CPU, by the trace's sizes; --impl reference replays it in seconds \(it checks the "
                        r"trace, not the Triton kernels\)\n", first), first
    from tests.support.trace_helpers import TINY, make_trace
    from traces.synth.simulation import SynthConfig

    tiny = make_trace(tmp_path / "t.safetensors", SynthConfig(**{**TINY.__dict__, "requests": 2}))
    done = _kda("replay", str(tiny), "--format", "json", env={"CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert re.fullmatch(r"replay: \d+ events through the Triton interpreter \(no CUDA device\): roughly \d+ s on a "
                        r"2-core CPU, by the trace's sizes", lines[0]), lines  # short: no hint
    assert re.fullmatch(r"replay: 1/\d+, about \d+ s left", lines[1]), lines
    done = _kda("replay", str(tiny), "--impl", "reference", "--format", "json", env={"CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0 and "interpreter" not in done.stderr, done.stderr


def test_the_interpreter_estimate_is_given_for_implementations_that_run_triton(tmp_path, capsys, monkeypatch):
    """A module built on the reference runs no Triton kernel: no interpreter time is claimed
    for it (a 14 s estimate for a 2 s run); kda's kernels and modules on them get one."""
    from tests.support.trace_helpers import make_trace
    from traces.impl.loader import load_impl
    from traces.replay.cost import runs_triton

    broken = REPO / "tests" / "broken_impls"
    assert [runs_triton(load_impl(str(spec))) for spec in (
        "triton", REPO / "examples" / "recoverssm_module.py", REPO / "tests" / "support" / "documented_surface.py",
        broken / "conv_window_off_by_one.py")] == [True] * 4
    assert [runs_triton(load_impl(str(spec))) for spec in (
        "reference", broken / "verify_writes_past_the_window.py", broken / "commit_out_of_resources.py")] == [False] * 3
    trace = make_trace(tmp_path / "t.safetensors")
    code, _, err = run_kda(["replay", str(trace), "--impl", str(broken / "flush_consumes_pending.py"), "--format",
                            "json"], capsys, monkeypatch)
    assert code == 1 and "interpreter" not in err and err.startswith("replay: 1/"), err


def test_event_costs_follow_rows_heads_and_the_state_tile(tmp_path):
    from tests.support.trace_helpers import make_trace
    from traces.format.io import read_trace
    from traces.replay.cost import SMALL_OP_UNITS, TILE_OVERHEAD, event_units

    with read_trace(make_trace(tmp_path / "t.safetensors")) as trace:
        units = event_units(trace)
        d = trace.manifest.dims
        for event, cost in zip(trace.events, units):
            want = {"verify": 1.0, "commit": 0.7, "flush": 0.7}.get(event.op)
            if want is None:  # plan, defer, write
                assert cost == SMALL_OP_UNITS
                continue
            rows = trace.meta(event.inputs["state_indices"]).shape[0]
            assert cost == want * rows * d.H * (d.K * d.V + TILE_OVERHEAD)


def test_long_work_reports_progress_outside_a_terminal(tmp_path):
    out = tmp_path / "t.safetensors"
    done = _kda("synth", str(out), "--requests", "3")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith("synth: requests finished: ") and lines[-1] == "synth: requests finished: 3/3"
    assert done.stdout.startswith(f"wrote {out}: ") and out.is_file()


def test_progress_outside_a_terminal_ends_with_the_final_count(monkeypatch, capsys):
    """Lines come at most every few seconds, so the last update may not have one: the end of
    the work logs it, once; work that logged nothing logs nothing at its end either."""
    import kda_cli.output as output

    ticks = iter(range(100))  # a second a call: every update within LINE_SECONDS of the first
    monkeypatch.setattr(output.time, "monotonic", lambda: float(next(ticks)))
    with output.Progress("synth: requests finished", 8, terminal=False) as bar:
        for done in (1, 5, 8):
            bar.update(done)
    assert capsys.readouterr().err == "synth: requests finished: 1/8\nsynth: requests finished: 8/8\n"
    monkeypatch.setattr(output.time, "monotonic", lambda: 0.0)
    with output.Progress("replay", 2, terminal=False) as bar:
        bar.update(2)
    with output.Progress("slice", 0, terminal=False):
        pass
    assert capsys.readouterr().err == "replay: 2/2\n"


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


def test_the_ops_through_line_names_each_implementation_once(capsys):
    """A file path five times over said nothing the one time does not: each implementation
    once, its ops after it, with the function a route names."""
    from kda_cli.commands.replay import _render
    from traces.replay.compare import DEFAULT_TOLERANCES
    from traces.replay.engine import ReplayReport
    from traces.format.schema import BufferSizes, Dims, Manifest

    manifest = Manifest(Dims(H=2, K=16, V=16, T=4), "bfloat16", "float32", -5.0, BufferSizes(2, 2, 2), {}, {})
    manifest.events = []
    path, surface = "tests/broken_impls/racy_verify.py", "tests/support/documented_surface.py"
    for routes, line in (
            ({op: path for op in ("verify", "plan", "defer", "commit", "flush")},
             f"ops through: {path}: verify, plan, defer, commit, flush"),
            ({"verify": f"{surface} (kda_recoverssm_verify)", "plan": "triton", "defer": f"{surface} "
              "(_defer_commit_kernel)", "commit": "triton", "flush": f"{surface} (_prepare_flush_plan_kernel) + "
              "triton (commit)", "commit_layers": "triton (kernels.context.engine)"},
             f"ops through: {surface}: verify (kda_recoverssm_verify), defer (_defer_commit_kernel), flush "
             "(_prepare_flush_plan_kernel); triton: plan, commit, flush (commit), commit_layers "
             "(kernels.context.engine)")):
        _render(ReplayReport("t.safetensors", path, "cpu", dict(DEFAULT_TOLERANCES), event_range=(0, 0),
                             routes=routes), manifest)
        assert capsys.readouterr().out.splitlines()[2] == line


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


def test_every_program_the_readme_runs_exists():
    """The README's commands run files of the repository (its recording example once named a
    ``serve.py`` that was not there) and patch modules that import."""
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    text = (root / "README.md").read_text()
    scripts = set(re.findall(r"python3 ((?:[\w.-]+/)*[\w.-]+\.(?:py|sh))", text))
    scripts |= set(re.findall(r"(?:bash|sh) ((?:[\w.-]+/)+[\w.-]+\.sh)", text))
    assert "examples/serve_engine.py" in scripts
    missing = sorted(s for s in scripts if not (root / s).is_file() and not s.startswith("bug/"))
    assert not missing, f"the README runs files the repository lacks: {missing}"
    for module in set(re.findall(r"--patch ([a-z_][\w.]*)", text)):
        if module.startswith("vllm."):  # the released engine: in the tree fetched from the package index
            from tests.support.vllm_release import release_tree

            tree, reason = release_tree()
            if tree is None:
                pytest.skip(reason)
            assert (tree / (module.replace(".", "/") + ".py")).is_file(), f"--patch {module}: not in the release"
            continue
        assert importlib.util.find_spec(module) is not None, f"--patch {module}: no such module"


def test_kda_debug_shows_the_implementation_frame_that_raised(tmp_path, capsys, monkeypatch):
    """``KDA_DEBUG=1``: the traceback goes down to the implementation's own ``raise``, which the
    ``Error:`` line (raised over it ``from None``) would hide; the line still comes last."""
    from tests.support.trace_helpers import make_trace

    trace = make_trace(tmp_path / "t.safetensors")
    impl = tmp_path / "faulty.py"
    impl.write_text("from kernels.reference import *  # noqa: F401,F403\n\n\n"
                    "def kda_recoverssm_verify(*args, **kwargs):\n"
                    "    raise RuntimeError(\"illegal memory access (simulated)\")\n")
    monkeypatch.setenv("KDA_DEBUG", "1")
    code, out, err = run_kda(["replay", str(trace), "--impl", str(impl), "--no-progress"], capsys, monkeypatch)
    lines = err.strip().splitlines()
    assert code == 3 and out == ""
    assert f'File "{impl}", line ' in err and 'raise RuntimeError("illegal memory access (simulated)")' in err
    assert lines[-1].startswith("Error: ") and "RuntimeError: illegal memory access (simulated)" in lines[-1]


def test_impl_and_patch_import_modules_of_the_current_folder_alike(tmp_path, capsys, monkeypatch):
    """``--impl pkg.mod`` from the folder that holds ``pkg`` imports it, as ``--patch pkg.mod``
    does in the recorded program: the current folder is importable for both."""
    from tests.support.trace_helpers import make_trace
    from traces.record.run import child_env

    trace = make_trace(tmp_path / "t.safetensors")
    (tmp_path / "cwd_kernels").mkdir()
    (tmp_path / "cwd_kernels" / "__init__.py").write_text("")
    (tmp_path / "cwd_kernels" / "ref.py").write_text("from kernels.reference import *  # noqa: F401,F403\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    code, out, err = run_kda(["replay", "t.safetensors", "--impl", "cwd_kernels.ref", "--format", "json",
                              "--no-progress"], capsys, monkeypatch)
    assert code == 0, err
    assert json.loads(out)["routes"]["verify"] == "cwd_kernels.ref"
    env, _ = child_env(tmp_path / "r.safetensors", patches=["cwd_kernels.ref"], base={"TRITON_INTERPRET": "1"})
    assert str(tmp_path) in env["PYTHONPATH"].split(os.pathsep)


def test_a_closed_pipe_keeps_the_exit_code_of_the_work(tmp_path):
    """``kda replay ... | head``: the reader is gone before the report is written; the exit
    code is still the replay's (0 passes, 1 mismatches), with nothing on stderr about it."""
    from tests.support.trace_helpers import make_trace

    trace = make_trace(tmp_path / "t.safetensors")
    broken = str(REPO / "tests" / "broken_impls" / "verify_writes_past_the_window.py")
    for impl, verdict in (("reference", 0), (broken, 1)):
        read, write = os.pipe()
        os.close(read)
        try:
            done = subprocess.run([sys.executable, "-m", "kda_cli", "replay", str(trace), "--impl", impl,
                                   "--no-progress"], stdout=write, stderr=subprocess.PIPE, text=True, timeout=120,
                                  env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)})
        finally:
            os.close(write)
        assert (done.returncode, done.stderr) == (verdict, "")


def test_version_option_and_h_for_help_on_every_command(capsys, monkeypatch):
    from importlib import metadata

    code, out, err = run_kda(["--version"], capsys, monkeypatch)
    assert (code, out, err) == (0, f"kda {metadata.version('kda-recoverssm')}\n", "")
    names = [name for name, _ in _commands()]
    assert len(names) >= 9  # version, info, replay, synth, slice, repro, bench, record run, record merge
    for name in ["", *names]:
        code, out, err = run_kda([*name.split(), "-h"], capsys, monkeypatch)
        assert code == 0 and out.startswith(f"Usage: kda {name}".rstrip() + " ") and err == "", (name, out, err)


@pytest.mark.parametrize("given, meant", [("trition", "triton"), ("refrence", "reference")])
def test_a_misspelt_impl_is_told_what_was_meant(given, meant, capsys, monkeypatch):
    code, out, err = run_kda(["replay", "--impl", given, "--no-progress"], capsys, monkeypatch)
    assert (code, out) == (2, "")
    assert err.strip().splitlines() == [f"Error: --impl {given}: cannot import it (No module named '{given}'); "
                                        f"did you mean {meant}?"]


def test_the_readme_starts_a_cpu_user_on_a_small_trace(tmp_path, capsys, monkeypatch):
    """Its first section is short points (not one sentence of four topics); the first trace
    it has a user write replays on a CPU in seconds, and a Kimi-K3-shaped synth says GPU."""
    import shlex

    from traces.format.io import read_trace
    from traces.replay.cost import event_units, rough_seconds

    text = (REPO / "README.md").read_text()
    first = text.split("## First commands\n", 1)[1].split("\n## ", 1)[0]
    prose = first.split("```", 1)[0]
    assert len([point for point in prose.split("\n- ") if point.strip()]) >= 3
    sentences = re.split(r"(?<=[.;:])\s", " ".join(prose.split()))
    assert max(len(sentence.split()) for sentence in sentences) <= 30, sentences
    synths = re.findall(r"^(kda synth [^#&\n]*)(.*)$", text, re.M)
    assert "kda synth" in first and not any("k3-tp8" in command and "GPU" not in rest for command, rest in synths)
    args = shlex.split(synths[0][0])[1:]
    assert "--preset" not in args or args[args.index("--preset") + 1] == "tiny"
    monkeypatch.chdir(tmp_path)
    code, _, err = run_kda(args, capsys, monkeypatch)
    assert code == 0, err
    with read_trace(tmp_path / args[1]) as trace:
        assert rough_seconds(sum(event_units(trace))) < 30 and (tmp_path / args[1]).stat().st_size < 2**20
