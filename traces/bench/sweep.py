"""The preset sweep: every (T, B, implementation, op or step) of a ``BenchConfig`` timed on
synthetic workloads (``workload``). After timing, every row checks that outputs, records and
state are finite. An interpreter smoke run (``smoke=True``) runs a tiny shape through the
same code twice per row; its times are wall-clock times of the Triton interpreter, labelled
as not measurements, with no bandwidth figures.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Callable

import torch

from traces.bench import timers
from traces.bench.config import PRESETS, BenchConfig
from traces.bench.contract_bytes import Shape, model_folded_tokens, model_op_bytes
from traces.bench.designs import under_forced_designs
from traces.bench.results import SMOKE_LABEL, BenchRun, Row
from traces.bench.runner import finished_rows, impl_routes, start_run, timing_record
from traces.bench.workload import STATE_DTYPES, Workload, accepted_counts, choose_sets, set_bytes

SMOKE_SETS = 2
"""Sets per row in a smoke run: the fewest that still run each op over disjoint sets."""


@under_forced_designs
def run_bench(config: BenchConfig, device: str, progress: Callable[[str], None] = lambda _: None) -> BenchRun:
    """Time every (T, B, implementation, op) of ``config`` on ``device``.

    ``device`` is ``cuda`` for measurements; a smoke run may use the CPU (Triton interpreter).
    A row that cannot be timed keeps its place with ``error`` set and no times. On
    ``KeyboardInterrupt`` it stops and returns the rows finished so far, ``interrupted``.
    """
    from traces.format.provenance import environment

    preset = PRESETS[config.preset]
    state_dtype = STATE_DTYPES[config.state_dtype]
    act = getattr(torch, preset.activation_dtype)
    shape = Shape(preset.heads, preset.head_k_dim, preset.head_v_dim, act.itemsize, state_dtype.itemsize)
    impls, cuda, mode, call_mode, timer, ceiling = start_run(config, device, progress)

    rows: list[Row] = []
    try:
        for T in config.spec_lens:
            for B in config.batches:
                counts = accepted_counts(config.accept, B, T, config.seed)
                commit_lens = [min(n, T) for n in counts]
                L = config.layers
                if config.smoke:
                    n_sets = SMOKE_SETS
                else:
                    free = torch.cuda.mem_get_info(device)[0] if cuda else None
                    n_sets = choose_sets(shape.slot_bytes, B, config.touch_bytes,
                                         set_bytes(preset, state_dtype, B, T), free)
                n_sets = -(-n_sets // L) * L  # whole models of L layers
                for spec, impl in impls.items():
                    try:
                        work = Workload(impl, preset, state_dtype, B, T, counts, n_sets, device, config.seed, L,
                                        contexts="commit-context" in config.ops)
                    except (RuntimeError, ValueError, TypeError) as exc:
                        work, setup_error = None, f"workload set-up failed: {type(exc).__name__}: {exc}"
                    for name in config.ops:
                        nbytes = model_op_bytes(name, shape, B, T, commit_lens, L)
                        row = Row(spec, name, B, T, mode, n_sets, 0, None, None, None, nbytes,
                                  model_folded_tokens(name, commit_lens, L))
                        rows.append(row)
                        if work is None:
                            row.error = setup_error
                            continue
                        progress(f"{spec} {name} B={B} T={T} ({n_sets} sets)")
                        try:
                            times = timers.time_calls(lambda: work.run(name), lambda: work.restore(name),
                                                      work.calls, timer, config, call_mode)
                            if not work.finite():
                                raise RuntimeError("non-finite values in outputs, records or state")
                        except Exception as exc:  # a failed row is reported, never timed wrongly
                            row.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
                            progress(f"{spec} {name} B={B} T={T}: {row.error}")
                            continue
                        timers.fill_times(row, times, ceiling)
                    del work
                    if cuda:
                        torch.cuda.empty_cache()
    except KeyboardInterrupt:  # keep what is finished; the row in flight has neither times nor error
        rows = finished_rows(rows)
        interrupted = True
    else:
        interrupted = False

    workload = {
        "preset": config.preset, "heads": preset.heads, "head_k_dim": preset.head_k_dim,
        "head_v_dim": preset.head_v_dim, "activation_dtype": preset.activation_dtype,
        "state_dtype": str(state_dtype).removeprefix("torch."), "lower_bound": preset.lower_bound,
        "accept": config.accept, "seed": config.seed, "layers": config.layers, "batches": list(config.batches),
        "spec_lens": list(config.spec_lens), "impls": list(config.impls), "ops": list(config.ops),
        "routes": impl_routes(impls, config.ops),
    }
    return BenchRun(workload=workload, timing=timing_record(config, mode, timer), environment=environment(),
                    copy_ceiling=ceiling, rows=rows, label=SMOKE_LABEL if config.smoke else None,
                    interrupted=interrupted,
                    created=datetime.now(timezone.utc).isoformat(timespec="seconds"))
