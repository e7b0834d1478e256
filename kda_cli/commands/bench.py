"""``kda bench``: time the RecoverSSM ops and decode steps; parsing and rendering only.

The engine (workloads, timing, byte counts, save/compare) is ``traces.bench``.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from kda_cli.options import check_format, force_option, output_file, parse_designs, parse_ints, parse_names
from kda_cli.output import emit, implementation_prints, make_console, note, plural, routes_text
from kda_cli.runtime import EXIT_BAD_INPUT, EXIT_RUNTIME, CommandError, bad_input

NO_GPU = "kda bench needs a CUDA GPU; none found (use --interpreter-smoke for a CPU smoke run)"


def _progress(message: str) -> None:
    note(f"bench: {message}")


def _fmt_us(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}" if value < 100 else f"{value:.1f}"


def _render_human(run, ratios: dict, comparison) -> None:
    from rich.markup import escape
    from rich.table import Table

    console = make_console(pipe_width=240)  # a file or a pipe gets whole rows, not columns squeezed to 80
    w = run.workload
    if run.label:
        console.print(f"[bold]{escape(run.label)}[/]")
    source = f"trace {w['trace']} ({w['events']} events)" if "trace" in w else f"preset {w['preset']}"
    drawn = "" if "trace" in w else f", accept {w['accept']} (seed {w['seed']})"
    console.print(escape(f"{source}: H={w['heads']} K={w['head_k_dim']} V={w['head_v_dim']}, "
                         f"{w['activation_dtype']} activations, {w['state_dtype']} state, lower_bound "
                         f"{w['lower_bound']}{drawn}; timing mode {run.timing['mode']}; {run.environment['gpu']}"))
    if run.copy_ceiling:
        c = run.copy_ceiling
        console.print(f"copy ceiling: {c['gbps']:.0f} GB/s (device-to-device copy, {c['bytes'] / 2**30:.1f} GiB "
                      f"read+written, median of {c['count']})")
    impls = w["impls"]
    designs = w.get("designs", {})  # runs saved before --design record none
    console.print(escape("designs forced: " + (", ".join(f"{op}={d}" for op, d in designs.items()) if designs
                                               else "none (the decision table chooses)")))
    for impl, routes in w.get("routes", {}).items():  # runs saved before routes were recorded have none
        console.print(escape(f"{impl}: ops through {routes_text(routes)}"))
    real = not run.label
    traced = "trace" in w
    layers = w.get("layers", 1)  # runs saved before --layers have one
    per = f"call (one model of {layers} layers: each op on every layer)" if layers > 1 else "call"
    table = Table(title=escape(f"microseconds per {per}: median [p10-p90] x samples"), title_justify="left")
    for col in (("event",) if traced else ()) + ("op", "B", "T") + (() if traced else ("sets",)) + ("MB/call",):
        table.add_column(col, justify="left" if col == "op" else "right")
    for impl in impls:
        table.add_column(impl, justify="right")
        if real:
            table.add_column("GB/s", justify="right")
            table.add_column("% copy", justify="right")
    for impl in impls[1:]:
        table.add_column(f"{impl}/{impls[0]}", justify="right")
    if comparison is not None:
        table.add_column(f"{impls[0]} vs base", justify="right")
    by_key = {r.key: r for r in run.rows}
    base_ratio = {(c["impl"], c["name"], c["batch"], c["spec_len"], c["event"]): c["ratio"]
                  for c in comparison.rows} if comparison is not None else {}
    cases = list(dict.fromkeys(r.key[1:] for r in run.rows))
    for case in cases:
        name, B, T, event = case
        # a stopped run may hold a case for only some implementations
        first = next(by_key[(impl, *case)] for impl in impls if (impl, *case) in by_key)
        cells = ([str(event)] if traced else []) + [name, str(B), str(T)] + ([] if traced else [str(first.n_sets)])
        cells.append(f"{first.bytes / 1e6:.3f}")
        for impl in impls:
            r = by_key.get((impl, *case))
            if r is None:
                cells += ["not run"] + (["-", "-"] if real else [])
                continue
            if r.error:
                cells.append(f"failed ({r.error.split(':')[0]})")
            else:
                cells.append(f"{_fmt_us(r.median_us)} [{_fmt_us(r.p10_us)}-{_fmt_us(r.p90_us)}] x{r.count}")
            if real:
                cells.append("-" if r.gbps is None else f"{r.gbps:.0f}")
                cells.append("-" if r.copy_fraction is None else f"{100 * r.copy_fraction:.0f}%")
        for impl in impls[1:]:
            ratio = ratios.get((impl, *case))
            cells.append("-" if ratio is None else f"{ratio:.2f}x")
        if comparison is not None:
            ratio = base_ratio.get((impls[0], *case))
            cells.append("-" if ratio is None else f"{ratio:.3f}")
        table.add_row(*(escape(c) for c in cells))
    console.print(table)
    if comparison is not None:
        gm = "-" if comparison.geomean is None else f"{comparison.geomean:.3f}"
        console.print(f"vs base (time ratio, < 1 is faster): geometric mean {gm} over {len(comparison.rows)} rows"
                      f"{f', {comparison.unmatched} rows without a base' if comparison.unmatched else ''}")


def bench(
    preset: Optional[str] = typer.Option(None, "--preset", help="workload shape: k3-tp8 (default), or tiny (smoke default)"),
    batch: Optional[str] = typer.Option(None, "--batch", help="batch sizes, comma-separated [preset's: 1,8,32,64,128,256]"),
    spec_len: Optional[str] = typer.Option(None, "--spec-len", help="window lengths T, comma-separated [preset's: 8]"),
    state_dtype: Optional[str] = typer.Option(None, "--state-dtype",
                                              help="checkpoint state dtype: float32/fp32 (default) or bfloat16/bf16"),
    accept: Optional[str] = typer.Option(None, "--accept",
                                         help="accepted tokens per row: full (T, default) or random (0..T, seeded)"),
    impl: List[str] = typer.Option(["triton"], "--impl", metavar="IMPL[,IMPL...]",
                                   help="implementations side by side: triton, reference, a module or a .py file; "
                                        "repeat or comma-separate"),
    ops: Optional[str] = typer.Option(None, "--ops", help="ops and steps to time, comma-separated "
                                      "[all: verify,plan,defer,commit,flush,flush-verify,step-stock,step-deferred; also commit-layers, "
                                      "commit-context]"),
    eager: bool = typer.Option(False, "--eager", help="time eager calls instead of CUDA graph replays"),
    reps: int = typer.Option(100, "--reps", help="most samples per row (fewer if --row-seconds runs out, but at "
                                                 "least 10, or --reps if fewer)"),
    row_seconds: float = typer.Option(2.0, "--row-seconds", help="time budget per row, in seconds"),
    touch_mb: Optional[int] = typer.Option(None, "--touch-mb",
                                           help="state read per sample in MiB (default 512); sets the number of disjoint sets"),
    seed: int = typer.Option(0, "--seed", help="seed of inputs and of --accept random"),
    trace: Optional[str] = typer.Option(None, "--trace", help="time each event of this trace instead of a preset sweep"),
    save: Optional[Path] = typer.Option(None, "--save", help="write the run as JSON to this file"),
    compare: Optional[str] = typer.Option(None, "--compare", help="a saved run: per-row time ratio and geometric mean"),
    format: str = typer.Option("human", "--format", help="human or json"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="write GB/s against batch to this PNG (needs matplotlib)"),
    layers: int = typer.Option(1, "--layers", help="KDA layers of a model: every row times one model's calls "
                                                   "(add commit-layers to --ops for its one commit of all layers, "
                                                   "commit-context for its whole commit through each --impl's "
                                                   "commit context)"),
    design: Optional[str] = typer.Option(None, "--design", metavar="OP=DESIGN[,OP=DESIGN...]",
                                         help="force these designs (kernels.launch.DESIGNS) for the timed calls, "
                                              "as KDA_DESIGN does; the run records them"),
    interpreter_smoke: bool = typer.Option(False, "--interpreter-smoke",
                                           help="CPU smoke run through the Triton interpreter; its times are not measurements"),
    force: bool = force_option("the --save and --plot files"),
) -> None:
    """Time verify, plan, defer, commit, flush, flush-verify and whole decode steps on a CUDA GPU.

    Each sample replays one CUDA graph over enough disjoint state slots that state comes from DRAM, with consumed state restored and L2 flushed between samples; rows report median, p10/p90 and count, contract bytes per call, GB/s and the fraction of a copy ceiling measured in the same run. With --trace, each recorded event is timed from the buffers just before it. With --design, the timed calls run the designs named (as KDA_DESIGN forces them) and the run records them. Ctrl-C or SIGTERM stops the run: the rows finished are saved and printed, and it exits 3.
    """
    check_format(format)
    if trace is not None:
        given = [flag for flag, value in (("--preset", preset), ("--batch", batch), ("--spec-len", spec_len),
                                          ("--state-dtype", state_dtype), ("--accept", accept), ("--ops", ops),
                                          ("--touch-mb", touch_mb), ("--plot", plot)) if value is not None]
        if given:
            raise CommandError(f"{', '.join(given)} describe a preset sweep and do not apply with --trace",
                               EXIT_BAD_INPUT)
    from traces.bench.config import OPS, BenchConfig

    try:
        config = BenchConfig(
            preset=preset or ("tiny" if interpreter_smoke else "k3-tp8"), batches=parse_ints("--batch", batch),
            spec_lens=parse_ints("--spec-len", spec_len), state_dtype=state_dtype or "float32", accept=accept or "full",
            impls=parse_names(impl), ops=parse_names([ops]) if ops is not None else OPS,
            mode="eager" if eager else "graph", reps=reps, row_seconds=row_seconds,
            touch_bytes=(touch_mb if touch_mb is not None else 512) * 2**20, seed=seed, smoke=interpreter_smoke,
            layers=layers)
    except ValueError as exc:
        raise CommandError(str(exc), EXIT_BAD_INPUT) from None
    for option, path in (("--save", save), ("--plot", plot)):
        if path is not None:
            output_file(path, option, inputs=[Path(trace)] if trace is not None else [], force=force)
    if plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise CommandError("--plot needs matplotlib (pip install matplotlib)", EXIT_BAD_INPUT) from None

    from traces import bench as engine

    base = None
    if compare is not None:
        try:
            base = engine.load_run(compare)
        except ValueError as exc:
            raise CommandError(f"--compare: {exc}", EXIT_BAD_INPUT) from None

    if trace is not None and not Path(trace).is_file():
        what = "is a folder, not a trace file" if Path(trace).is_dir() else "no such file"
        raise CommandError(f"--trace {trace}: {what}", EXIT_BAD_INPUT)
    from kda_cli.runtime import cuda_available, select_device

    if not interpreter_smoke and not cuda_available():
        raise CommandError(NO_GPU, EXIT_RUNTIME)
    device = select_device()  # a smoke run without a GPU: the interpreter's; a bad KDA_DESIGN is bad input
    if design is not None:
        from kernels.launch import DESIGNS  # after the device: the kernels are defined for it

        config.designs = parse_designs("--design", design, DESIGNS)

    if interpreter_smoke:
        _progress(engine.SMOKE_LABEL)

    # Ctrl-C and SIGTERM stop the engine, which keeps the rows finished
    with bad_input(), implementation_prints(format):
        if trace is not None:
            from traces.format.io import read_trace

            with bad_input("--trace: "):
                opened = read_trace(trace)
            with opened:
                run = engine.run_trace_bench(opened, config, device, progress=_progress)
        else:
            run = engine.run_bench(config, device, progress=_progress)

    ratios = engine.impl_ratios(run)
    comparison = engine.compare_runs(run, base) if base is not None else None
    if save is not None:
        try:
            engine.save_run(run, str(save))
        except OSError as exc:
            raise CommandError(f"--save: cannot write {save}: {exc.strerror}", EXIT_RUNTIME) from None
    if plot is not None:
        engine.plot_run(run, str(plot))
    out = run.to_dict()
    out["impl_ratios"] = [{"impl": k[0], "name": k[1], "batch": k[2], "spec_len": k[3], "event": k[4],
                           "ratio": v} for k, v in ratios.items()]
    out["comparison"] = None if comparison is None else {
        "base": compare, "rows": comparison.rows, "geomean": comparison.geomean, "unmatched": comparison.unmatched}
    emit(out, format, lambda _: _render_human(run, ratios, comparison))
    if run.interrupted:
        finished = plural(len(run.rows), "finished row")
        kept = f", saved to {save}" if save is not None else ""
        raise CommandError(f"interrupted after {finished}{kept}", EXIT_RUNTIME)
    failed = [r for r in run.rows if r.error]
    if failed:
        r = failed[0]
        where = f"event {r.event} {r.name}" if r.event is not None else f"{r.name} B={r.batch} T={r.spec_len}"
        raise CommandError(f"{len(failed)} of {len(run.rows)} rows could not be timed "
                           f"(first: {r.impl} {where}: {r.error})", EXIT_RUNTIME)
