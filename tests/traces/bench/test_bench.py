"""``kda bench``: CPU behaviour, the interpreter smoke run, byte counts, save and compare.

No test here asserts a time: timings belong to runs on a GPU, not to tests.
"""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest

from traces import bench

REPO = Path(__file__).resolve().parents[3]
TINY = bench.Shape(heads=2, head_k_dim=16, head_v_dim=16, act_bytes=2, state_bytes=4)
K3 = bench.Shape(heads=12, head_k_dim=128, head_v_dim=128, act_bytes=2, state_bytes=4)
FOLDING = ("commit", "flush", "flush-verify", "step-stock", "step-deferred")
"""The ops and steps that fold tokens into state."""


def kda(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kda_cli", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "NO_COLOR": "1", **env}, timeout=120)


def test_no_gpu_is_one_error_line_and_exit_3():
    result = kda("bench", CUDA_VISIBLE_DEVICES="")
    assert result.returncode == 3
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "Error: kda bench needs a CUDA GPU; none found (use --interpreter-smoke for a CPU smoke run)"]


@pytest.mark.parametrize("args, message", [
    (("--accept", "sometimes"), "accept must be one of full, random"),
    (("--batch", "8,x"), "--batch 8,x: expected comma-separated integers"),
    (("--ops", "verify,fold"), "unknown op fold (known: verify, plan"),
])
def test_bad_usage_is_one_error_line_and_exit_2(args, message):
    result = kda("bench", *args, CUDA_VISIBLE_DEVICES="")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0]
    assert "Traceback" not in result.stderr


def test_tiny_shape_bytes_by_hand():
    # B=2, T=2, H=2, K=V=16, bf16 activations, fp32 state; one slot = 2*16*16*4 = 2048 bytes.
    # verify: state 2*2048 = 4096; q,k,g,v,beta 4 tokens*2 heads*(3*16+16+1)*2 = 1040;
    # out 4*2*16*2 = 256; records 4 tokens*2 heads*(16*4 + 32*2) = 1024.
    assert bench.verify_bytes(TINY, real_rows=2, total_tokens=4) == 4096 + 1040 + 256 + 1024
    # commit of [2, 1] tokens: two slots read and written 4*2048, three tokens of records 3*256.
    assert bench.commit_bytes(TINY, [2, 1]) == 8192 + 768
    assert bench.commit_bytes(TINY, [2, 0]) == 4096 + 512
    assert bench.plan_bytes(2) == 4 * (2 + 3 + 2) + 4 * 4 * 2
    assert bench.defer_bytes(2) == 40
    assert bench.flush_bytes(TINY, [2, 1]) == 2 * 32 + 8960
    assert bench.op_bytes("step-stock", TINY, 2, 2, [2, 1]) == 6416 + 60 + 8960
    # a deferred step reads each flushed slot once: the flush's and the verify's bytes less 2*2048
    assert bench.flush_verify_bytes(TINY, 2, 2, [2, 1]) == 9024 + 6416 - 4096
    assert bench.op_bytes("step-deferred", TINY, 2, 2, [2, 1]) == 9024 + 6416 - 4096 + 60 + 40


def test_k3_verify_bytes_by_hand():
    # B=256, T=8: 256 fp32 slots of 786,432 bytes; 2048 tokens of 12 heads.
    state = 256 * 786_432
    activations = 2048 * 12 * (3 * 128 + 128 + 1) * 2
    outputs = 2048 * 12 * 128 * 2
    records = 2048 * 12 * (128 * 4 + 256 * 2)
    assert bench.verify_bytes(K3, 256, 2048) == state + activations + outputs + records == 257_998_848


def test_sets_cover_the_requested_state_and_respect_memory():
    slot = K3.slot_bytes
    assert slot == 786_432
    assert bench.choose_sets(slot, 256, 512 * 2**20, 1, None) == 3
    assert bench.choose_sets(slot, 1, 512 * 2**20, 1, None) == 683
    assert bench.choose_sets(slot, 256, 2**20, 1, None) == 2
    assert bench.choose_sets(slot, 1, 512 * 2**20, 10, 400) == 20


def test_accepted_counts():
    assert bench.accepted_counts("full", 3, 8, 0) == [8, 8, 8]
    drawn = bench.accepted_counts("random", 64, 4, 7)
    assert drawn == bench.accepted_counts("random", 64, 4, 7)
    assert set(drawn) == {0, 1, 2, 3, 4}


def test_percentiles_interpolate():
    values = [float(v) for v in range(10, 0, -1)]
    assert [bench.percentile(values, q) for q in (10, 50, 90)] == pytest.approx([1.9, 5.5, 9.1])


def test_interpreter_smoke_run_times_every_op_of_each_impl(device):
    config = bench.BenchConfig(preset="tiny", batches=(2,), impls=("triton", "reference"), accept="random",
                               seed=3, smoke=True)
    run = bench.run_bench(config, device)
    assert run.label == bench.SMOKE_LABEL and run.copy_ceiling is None
    counts = bench.accepted_counts("random", 2, 2, 3)
    for impl in ("triton", "reference"):
        rows = {r.name: r for r in run.rows if r.impl == impl}
        assert tuple(rows) == bench.OPS
        for name, r in rows.items():
            assert r.error is None and r.count == 2 and r.median_us > 0 and r.p10_us <= r.median_us <= r.p90_us
            assert r.gbps is None and r.copy_fraction is None and r.mode == "smoke" and r.n_sets == 2
            assert r.bytes == bench.op_bytes(name, TINY, 2, 2, counts)
            assert r.committed_tokens == (sum(counts) if name in FOLDING else 0)
    ratios = bench.impl_ratios(run)
    assert ratios[("triton", "verify", 2, 2, None)] == 1.0
    assert ratios[("reference", "verify", 2, 2, None)] > 0


def test_interpreter_smoke_cli_json_and_save_round_trip(tmp_path):
    saved = tmp_path / "run.json"
    result = kda("bench", "--interpreter-smoke", "--batch", "1", "--ops", "verify,step-deferred",
                 "--format", "json", "--save", str(saved))
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert printed["label"] == bench.SMOKE_LABEL
    assert [(r["name"], r["error"], r["count"]) for r in printed["rows"]] == [("verify", None, 2), ("step-deferred", None, 2)]
    loaded = bench.load_run(str(saved))
    assert loaded.to_dict() == {k: v for k, v in printed.items() if k not in ("impl_ratios", "comparison")}
    bench.save_run(loaded, str(tmp_path / "again.json"))
    assert bench.load_run(str(tmp_path / "again.json")).to_dict() == loaded.to_dict()


def test_a_documented_surface_module_benches_and_the_run_says_what_ran_where(device):
    """The documented surface as an implementation: defer and flush run (plan, commit through
    kda's kernels), and the run records and prints which op ran through which implementation."""
    surface = "tests/support/documented_surface.py"
    config = bench.BenchConfig(preset="tiny", batches=(2,), impls=("triton", surface), ops=("defer", "flush"),
                               smoke=True)
    run = bench.run_bench(config, device)
    assert [(r.impl, r.name, r.error) for r in run.rows] == [
        ("triton", "defer", None), ("triton", "flush", None), (surface, "defer", None), (surface, "flush", None)]
    routes = run.workload["routes"]
    assert routes["triton"] == {op: "triton" for op in ("verify", "plan", "defer", "commit", "flush")}
    assert routes[surface]["defer"] == f"{surface} (_defer_commit_kernel)" and routes[surface]["plan"] == "triton"
    result = kda("bench", "--interpreter-smoke", "--batch", "1", "--ops", "defer", "--impl", surface)
    assert result.returncode == 0, result.stderr
    assert f"{surface}: ops through {surface}: verify (kda_recoverssm_verify), defer (_defer_commit_kernel), flush " \
           "(_prepare_flush_plan_kernel); triton: plan, commit, flush (commit)\n" in result.stdout


DESIGN_SPY = """import os
import kernels
from kernels import KDARecoverSSMRecords
from kernels import defer_commit_kernel as _defer_commit_kernel
from kernels import prepare_flush_plan_kernel as _prepare_flush_plan_kernel

SEEN = os.path.join(os.path.dirname(__file__), "seen.txt")


def kda_recoverssm_verify(*args, **kwargs):
    with open(SEEN, "a") as f:
        f.write(os.environ.get("KDA_DESIGN", "") + "\\n")
    return kernels.kda_recoverssm_verify(*args, **kwargs)
"""


def test_design_forces_the_timed_calls_and_the_run_records_it(tmp_path):
    """``--design`` sets ``KDA_DESIGN`` for the timed calls (over what the environment forces);
    the printed and the saved run name every design forced, a run without it none."""
    spy = tmp_path / "spy.py"
    spy.write_text(DESIGN_SPY)
    saved = tmp_path / "run.json"
    result = kda("bench", "--interpreter-smoke", "--batch", "1", "--ops", "verify", "--impl", str(spy),
                 "--design", "verify=two-kernels", "--format", "json", "--save", str(saved),
                 KDA_DESIGN="commit=fold-in-tile")
    assert result.returncode == 0, result.stderr
    forced = {"commit": "fold-in-tile", "verify": "two-kernels"}
    assert json.loads(result.stdout)["workload"]["designs"] == forced
    assert bench.load_run(str(saved)).workload["designs"] == forced
    seen = (tmp_path / "seen.txt").read_text().splitlines()
    assert len(seen) >= 2 and set(seen) == {"commit=fold-in-tile,verify=two-kernels"}
    plain = kda("bench", "--interpreter-smoke", "--batch", "1", "--ops", "verify", "--impl", str(spy))
    assert plain.returncode == 0, plain.stderr
    assert "designs forced: none (the decision table chooses)\n" in plain.stdout
    assert set((tmp_path / "seen.txt").read_text().splitlines()[len(seen):]) == {""}


@pytest.mark.parametrize("value, message", [
    ("fold=token-loop", "--design fold=token-loop: unknown op 'fold' (ops: verify, flush-verify, commit,"),
    ("verify=two-kernels,commit=fastest", "--design verify=two-kernels,commit=fastest: unknown commit design "
                                          "'fastest' (designs: token-loop, fold-in-tile,"),
    ("verify", "--design verify: expected OP=DESIGN[,OP=DESIGN...], got 'verify'"),
    ("verify=one-pass,verify=two-kernels", "--design verify=one-pass,verify=two-kernels: verify given twice"),
])
def test_a_bad_design_is_one_error_line_and_exit_2(tmp_path, value, message):
    saved = tmp_path / "run.json"
    result = kda("bench", "--interpreter-smoke", "--batch", "1", "--ops", "verify", "--design", value,
                 "--save", str(saved))
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: " + message), lines
    assert not saved.exists()


def _synthetic(path: Path, medians: dict) -> str:
    rows = [bench.Row("triton", name, batch, 8, "graph", 3, 0 if us is None else 50, us, us, us, 1000, 8)
            for (name, batch), us in medians.items()]
    run = bench.BenchRun(workload={"impls": ["triton"]}, timing={}, environment={}, copy_ceiling=None, rows=rows)
    bench.save_run(run, str(path))
    return str(path)


def test_compare_ratios_and_geometric_mean(tmp_path):
    base = _synthetic(tmp_path / "base.json", {("verify", 8): 100.0, ("commit", 8): 40.0, ("plan", 8): None,
                                               ("flush", 8): 10.0})
    current = _synthetic(tmp_path / "current.json", {("verify", 8): 50.0, ("commit", 8): 32.0, ("plan", 8): 2.0,
                                                     ("defer", 8): 1.0})
    comparison = bench.compare_runs(bench.load_run(current), bench.load_run(base))
    assert [(c["name"], c["ratio"]) for c in comparison.rows] == [("verify", 0.5), ("commit", 0.8)]
    assert comparison.geomean == pytest.approx(math.sqrt(0.5 * 0.8))
    assert comparison.unmatched == 2  # plan has no base time, defer no base row


def test_a_plot_stopped_while_it_is_written_leaves_no_file(tmp_path, monkeypatch):
    """``--plot`` writes whole or not at all: a Ctrl-C inside ``savefig`` (matplotlib faked
    here, half a file written) leaves the old plot as it was and no temporary file."""
    def savefig(path, **_):
        Path(path).write_bytes(b"\x89PNG half")
        raise KeyboardInterrupt

    fig = mock.MagicMock(savefig=savefig)
    pyplot = mock.MagicMock(subplots=lambda **_: (fig, mock.MagicMock()))
    monkeypatch.setitem(sys.modules, "matplotlib", mock.MagicMock(pyplot=pyplot))
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", pyplot)
    run = bench.load_run(_synthetic(tmp_path / "run.json", {("verify", 8): 10.0}))
    run.workload.update(preset="k3-tp8", state_dtype="float32")
    run.timing["mode"] = "graph"
    plot = tmp_path / "bw.png"
    plot.write_bytes(b"old plot")
    with pytest.raises(KeyboardInterrupt):
        bench.plot_run(run, str(plot))
    assert plot.read_bytes() == b"old plot" and sorted(p.name for p in tmp_path.iterdir()) == ["bw.png", "run.json"]


def test_load_run_rejects_other_files(tmp_path):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": "something-else"}))
    with pytest.raises(ValueError, match="not a kda bench result"):
        bench.load_run(str(other))
    with pytest.raises(ValueError, match="cannot read"):
        bench.load_run(str(tmp_path / "missing.json"))
    binary = tmp_path / "run.png"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(ValueError, match=r"run\.png is not JSON \(not UTF-8 text\)"):
        bench.load_run(str(binary))


def test_trace_event_bytes_by_hand():
    s = bench.Shape(heads=2, head_k_dim=16, head_v_dim=16, act_bytes=2, state_bytes=4)  # T=2 below
    # verify: row 0 real (2 tokens, record row 0); row 1 null slot; row 2 empty window.
    # One slot read 2048; 3 tokens of activations 3*2*65*2 = 780 and outputs 3*2*16*2 = 192;
    # records of row 0's 2 tokens 2*256.
    verify = {"query_start_loc": [0, 2, 3, 3], "state_indices": [1, 0, 2], "record_indices": [0, 1, -1]}
    assert bench.event_bytes("verify", s, 2, verify, {}, []) == (2048 + 780 + 192 + 512, 0)
    # commit: row 0 folds 2 into final and boundary (after 1): 1 read + 2 writes + 2 tokens;
    # row 1 folds 1 into final: 1 read + 1 write + 1 token; row 2 folds nothing.
    plan = {"commit_lens": [2, 1, 0], "final_state_indices": [1, 4, 0], "boundary_state_indices": [5, 0, 0],
            "boundary_recovery_lens": [1, 0, 0]}
    assert bench.event_bytes("commit", s, 2, {"state_indices": [1, 2, 3]}, plan, []) == (
        3 * 2048 + 2 * 256 + 2 * 2048 + 256, 3)
    # flush: rows 0 and 1 share record row 1 (pending 3, clamped to T=2, consumed once); row 2 is null.
    flush = {"state_indices": [1, 2, 0], "record_rows": [1, 1, 0]}
    assert bench.event_bytes("flush", s, 2, flush, {}, [2, 3, 1]) == (3 * 32 + 2 * 2048 + 2 * 256, 2)
    # plan of 3 rows: 3 index columns and query_start_loc read, 4 plan columns written (4-byte
    # entries); align mode also reads num_computed and two block-table entries a row
    rows = {"state_indices": [1, 2, 0]}
    assert bench.event_bytes("plan", s, 2, rows, {}, []) == (4 * 10 + 4 * 12, 0)
    assert bench.event_bytes("plan", s, 2, {**rows, "block_table": [[1], [2], [0]]}, {}, []) == (4 * 10 + 4 * 9 + 4 * 12, 0)
    # defer: 5 int32 a row; eager flags a byte each
    assert bench.event_bytes("defer", s, 2, rows, {}, []) == (60, 0)
    assert bench.event_bytes("defer", s, 2, {**rows, "eager": [True, False, False]}, {}, []) == (63, 0)


def test_interpreter_smoke_trace_times_every_event(tmp_path, device):
    from traces.format.io import read_trace
    from traces.synth.simulation import SynthConfig, synthesize

    path = tmp_path / "tiny.safetensors"
    synthesize(SynthConfig(preset="tiny", requests=3, seed=1, max_batch=2, max_decode_steps=2, steps=3)).write(path)
    with read_trace(path) as trace:
        ops = [e.op for e in trace.events]
        run = bench.run_trace_bench(trace, bench.BenchConfig(impls=("triton",), smoke=True), device)
    assert [(r.event, r.name) for r in run.rows] == [(i, op) for i, op in enumerate(ops) if op != "write"]
    assert "write" in ops  # a reused slot's prefill: applied, not timed
    assert {"verify", "plan", "defer", "commit", "flush"} <= set(ops)
    assert all(r.error is None and r.count == 2 and r.median_us > 0 for r in run.rows)
    assert all(r.bytes > 0 for r in run.rows if r.name in ("verify", "plan", "defer", "flush"))
    assert run.workload["trace"] == str(path) and run.label == bench.SMOKE_LABEL


def test_a_missing_trace_is_bad_input_before_the_gpu_is_asked_for():
    result = kda("bench", "--trace", "nope.safetensors", CUDA_VISIBLE_DEVICES="")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["Error: --trace nope.safetensors: no such file"]


def test_trace_refuses_preset_options():
    result = kda("bench", "--trace", "x.safetensors", "--batch", "8", "--accept", "random", CUDA_VISIBLE_DEVICES="")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "Error: --batch, --accept describe a preset sweep and do not apply with --trace"]


def test_a_signal_during_capture_waits_for_its_end():
    """SIGTERM and Ctrl-C inside ``interrupts_held`` (a CUDA graph capture) stop the run only
    once the block is done, through the command line's handlers, which are back after it."""
    from kda_cli import runtime

    for sig in (signal.SIGTERM, signal.SIGINT):
        finished = []
        with runtime.stop_signals():
            before = signal.getsignal(sig)
            with pytest.raises(KeyboardInterrupt):
                with bench.interrupts_held():
                    os.kill(os.getpid(), sig)
                    time.sleep(0.05)  # the handler runs here, in the main thread
                    finished.append(True)
            assert signal.getsignal(sig) is before
            assert runtime.interrupted().code == 128 + sig
        assert finished == [True]


def _interrupt_the_second_row(monkeypatch) -> None:
    """Ctrl-C as the second row's timing starts."""
    from traces.bench import timers

    time_calls = timers.time_calls
    calls = []

    def interrupted_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return time_calls(*args, **kwargs)

    monkeypatch.setattr(timers, "time_calls", interrupted_second)


def test_an_interrupted_run_keeps_the_rows_it_finished(device, monkeypatch, tmp_path):
    """Ctrl-C during the second row: the first row comes back timed, the one in flight does not,
    and the run says it was interrupted, also once saved and loaded."""
    _interrupt_the_second_row(monkeypatch)
    config = bench.BenchConfig(preset="tiny", batches=(1,), ops=("plan", "defer", "commit"), smoke=True)
    run = bench.run_bench(config, device)
    assert run.interrupted
    assert [(r.name, r.error is None, r.median_us is not None) for r in run.rows] == [("plan", True, True)]
    bench.save_run(run, str(tmp_path / "run.json"))
    assert bench.load_run(str(tmp_path / "run.json")).interrupted


def test_a_run_stopped_between_implementations_prints_the_rows_it_has(device, monkeypatch, capsys):
    """Stopped after the first implementation's row of a case: the table shows that time and
    says the second implementation did not run, where it raised a KeyError before."""
    from kda_cli.commands.bench import _render_human
    monkeypatch.delenv("COLUMNS", raising=False)  # set by pytest -n's workers; the table takes a pipe's width
    _interrupt_the_second_row(monkeypatch)
    config = bench.BenchConfig(preset="tiny", batches=(1,), ops=("plan",), impls=("triton", "reference"),
                               smoke=True)
    run = bench.run_bench(config, device)
    assert run.interrupted and [(r.impl, r.name) for r in run.rows] == [("triton", "plan")]
    capsys.readouterr()
    _render_human(run, bench.impl_ratios(run), None)
    plan_row = next(line for line in capsys.readouterr().out.splitlines() if " plan " in line)
    cells = [c.strip() for c in plan_row.strip("│┃ ").split("│")]
    assert cells[:3] == ["plan", "1", "2"]
    assert cells[5].endswith(f"x{run.rows[0].count}") and cells[6:] == ["not run", "-"]


def test_save_is_whole_or_nothing(tmp_path, monkeypatch):
    """A save that fails half way leaves the file as it was and nothing beside it."""
    path = tmp_path / "run.json"
    _synthetic(path, {("verify", 8): 10.0})
    before = path.read_text()
    dump = json.dump

    def half_then_fail(obj, f, **kwargs):
        f.write(json.dumps(obj)[:20])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(json, "dump", half_then_fail)
    run = bench.load_run(str(path))
    with pytest.raises(OSError):
        bench.save_run(run, str(path))
    monkeypatch.setattr(json, "dump", dump)
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_sigterm_saves_the_finished_rows_and_exits_3(tmp_path):
    """``timeout`` sends SIGTERM: the rows finished are saved, then one Error line, exit 3. The
    signal comes as the second row starts, a step that takes seconds under the interpreter."""
    saved = tmp_path / "run.json"
    proc = subprocess.Popen([sys.executable, "-m", "kda_cli", "bench", "--interpreter-smoke", "--batch", "1",
                             "--ops", "plan,step-deferred,step-stock", "--format", "json", "--save", str(saved)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "NO_COLOR": "1"})
    try:
        started = 0
        for line in proc.stderr:  # progress lines, one a row
            started += line.startswith("bench: triton ")
            if started == 2:  # the first row is done
                proc.send_signal(signal.SIGTERM)
                break
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert started == 2
    assert proc.returncode == 3
    assert stderr.strip().splitlines()[-1] == f"Error: interrupted after 1 finished row, saved to {saved}"
    printed = json.loads(stdout)
    assert printed["interrupted"] and [r["name"] for r in printed["rows"]] == ["plan"]
    loaded = bench.load_run(str(saved))
    assert loaded.interrupted and [r.name for r in loaded.rows] == ["plan"] and loaded.rows[0].median_us > 0


def test_model_bytes_by_hand():
    from traces.bench.contract_bytes import model_folded_tokens, model_op_bytes

    # three layers: each op on every layer; a stock step plans once; commit-layers is three commits
    assert model_op_bytes("commit-layers", TINY, 2, 2, [2, 1], 3) == 3 * (8192 + 768)
    assert model_op_bytes("commit", TINY, 2, 2, [2, 1], 3) == 3 * (8192 + 768)
    assert model_op_bytes("step-stock", TINY, 2, 2, [2, 1], 3) == 3 * (6416 + 8960) + 60
    assert model_op_bytes("step-stock", TINY, 2, 2, [2, 1], 1) == 6416 + 60 + 8960
    assert model_folded_tokens("commit-layers", [2, 1], 3) == 9
    assert model_folded_tokens("verify", [2, 1], 3) == 0


def test_a_commit_of_all_layers_is_each_layer_s_commit(device):
    """The workload's one commit of a model's layers folds each layer's own set, as a commit a
    layer does; rows of a model run report a model's bytes."""
    import torch

    import kernels
    from traces.bench.workload import STATE_DTYPES, Workload

    counts = [2, 1]
    work = Workload(kernels, bench.PRESETS["tiny"], STATE_DTYPES["float32"], 2, 2, counts, 6, device, seed=5, layers=3)
    assert work.calls == 2 and len(work.layer_tables) == 2
    work.restore("commit")
    work.run("commit")
    per_layer = work.pool.clone()
    work.restore("commit-layers")
    work.run("commit-layers")
    assert not torch.equal(per_layer, work.pristine_pool)
    assert torch.allclose(work.pool, per_layer, rtol=1e-6, atol=1e-7)

    config = bench.BenchConfig(preset="tiny", batches=(2,), ops=("commit", "commit-layers", "step-stock"),
                               smoke=True, layers=3)
    run = bench.run_bench(config, device)
    rows = {r.name: r for r in run.rows}
    assert run.workload["layers"] == 3
    assert all(r.error is None and r.n_sets == 3 for r in rows.values())
    assert rows["commit-layers"].bytes == rows["commit"].bytes == 3 * bench.commit_bytes(TINY, [2, 2])


def test_a_commit_context_s_bytes_by_hand():
    from traces.bench.contract_bytes import CONV_WIDTH, model_folded_tokens, model_op_bytes

    # a plan through requests (60 + 16 bytes), then per layer the commit (8192 + 768) and the conv windows of
    # the folding rows: 2 rows x read and written x 3 inputs x 96 channels x 2 bytes
    assert CONV_WIDTH == 4 and TINY.conv_channels == 96
    assert model_op_bytes("commit-context", TINY, 2, 2, [2, 1], 3) == 60 + 16 + 3 * (8192 + 768 + 2 * 2 * 3 * 96 * 2)
    assert model_op_bytes("commit-context", TINY, 2, 2, [2, 0], 1) == 60 + 16 + 4096 + 512 + 2 * 3 * 96 * 2
    assert model_folded_tokens("commit-context", [2, 1], 3) == 9


@pytest.mark.parametrize("spec", ["triton", "examples/recoverssm_module.py"])
def test_a_commit_context_commits_what_commit_layers_does_and_moves_the_windows(device, spec):
    """Each implementation's context (kda's, the example module's own) over the workload's
    models leaves the state pool as ``commit-layers`` does, bit for bit, and each folding
    row's conv window at the entries ending at its last accepted token, in every layer."""
    import torch

    from traces.bench.workload import STATE_DTYPES, Workload
    from traces.impl.loader import load_impl

    impl = load_impl(spec)
    counts, B, T, L = [2, 1, 0], 3, 2, 2
    work = Workload(impl, bench.PRESETS["tiny"], STATE_DTYPES["float32"], B, T, counts, 4, device, seed=5, layers=L,
                    contexts=True)
    assert len(work.contexts) == 2
    work.restore("commit-layers")
    work.run("commit-layers")
    by_layers = work.pool.clone()
    work.restore("commit-context")
    work.run("commit-context")
    assert not torch.equal(by_layers, work.pristine_pool) and torch.equal(work.pool, by_layers)
    history = work.conv.shape[2] - T + 1
    moved = work.pristine_conv.clone()
    for s in range(4):  # set s is layer s % L of model s // L
        for b, n in enumerate(counts):
            if n > 0:
                slot = int(work.slots[s, b])
                moved[slot, :, :history] = work.pristine_conv[slot, :, n - 1:n - 1 + history]
    assert torch.equal(work.conv, moved)


def test_the_commit_context_row_appears_for_each_implementation_with_its_context(device):
    config = bench.BenchConfig(preset="tiny", batches=(2,), ops=("commit-layers", "commit-context"),
                               impls=("triton", "examples/recoverssm_module.py"), smoke=True, layers=2)
    run = bench.run_bench(config, device)
    rows = {(r.impl, r.name): r for r in run.rows}
    assert all(r.error is None and r.count > 0 for r in rows.values()) and len(rows) == 4
    for impl in config.impls:
        assert rows[(impl, "commit-context")].bytes > rows[(impl, "commit-layers")].bytes
    routes = run.workload["routes"]
    assert routes["triton"]["commit-context"] == "triton (kernels.context.engine)"
    assert routes["examples/recoverssm_module.py"]["commit-context"].endswith("(KDARecoverSSMCommitContext)")
