"""Benchmark engine for the RecoverSSM ops and whole decode steps, as a library.

Workload. For each batch size ``B`` and window ``T`` the engine builds ``n_sets`` disjoint
copies of one decode layer: each set has its own ``B`` state slots in one pool
(``[1 + n_sets*B, H, V, K]``, slot 0 null), its own record rows, activations, outputs,
commit plan and pending counts. All rows are real with full windows (``T`` tokens each);
``num_accepted`` is ``T`` for every row (``accept="full"``) or uniform in ``0..T`` from a
seeded generator (``accept="random"``), the same draw for every set (a request's accepted
count is the same in every layer). ``n_sets`` is chosen so that one sample reads at least
``touch_bytes`` of state (default 512 MiB, several times an H200's ~60 MB L2), capped by
free memory; it is reported with every row.

What one sample runs (``OPS``; each entry runs over every set, like consecutive layers):

    verify         verify(s) for each s
    plan           plan(s) for each s
    defer          defer(s) for each s             (plan restored: defer zeroes commit_lens)
    commit         commit(s) for each s            (in place, final = source)
    flush          flush(s) for each s             (flush plan + in-place commit)
    flush-verify   flush-verify(s) for each s      (one ``kda_recoverssm_flush_verify`` call
                                                    where the implementation has it, else
                                                    flush(s) then verify(s))
    step-stock     verify(s) for each s; then plan(s), commit(s) for each s
    step-deferred  flush-verify(s) for each s; then plan-deferred(s) for each s (one
                                                    ``kda_recoverssm_plan_deferred`` call where
                                                    the implementation has it, else plan(s)
                                                    then defer(s))

The step orders follow a real decode step: verify in the forward pass of every layer,
plan and commit after sampling; a deferred step flushes a layer's pending replay right
before its verify and defers after sampling. The plan is run once per set, which slightly
over-counts a step whose plan is shared by all layers.

Timing. In ``graph`` mode each (implementation, op, B, T) gets one CUDA graph capturing one
sample, after two warm-up runs on a side stream (the second under
``torch.cuda.set_sync_debug_mode("error")``: an implementation that synchronises with the
host cannot be captured and its row fails loudly instead). In ``eager`` mode the same
Python calls are issued directly. Before every sample, outside the timed region: the state
pool is restored from a pristine copy (for ops that write it), the plan columns and pending
counts are restored (a few KB), and a scratch buffer of at least four times the L2 size is
read, which evicts the restored state from L2 and leaves only clean lines (no write-back
in the timed region). Eager samples then synchronise the device, so launch overhead is
measured; graph samples do not, so the graph's host-side launch overlaps the flush, as
it overlaps earlier work in a real decode step. A sample is the time between two CUDA
events around the replay (or the eager calls), divided by ``n_sets``. Each row reports
the median per-call time, its 10th and 90th percentiles and the number of samples. A
device-to-device copy of a large buffer (bytes read plus written over its median time) is
measured in the same run and every row's GB/s is also given as a fraction of it.

Bytes per call come from the tensor contract (docs/design.md §4) for the workload's actual
accepted counts: see ``verify_bytes``, ``commit_bytes``, ``plan_bytes``, ``defer_bytes``,
``flush_bytes``, ``flush_verify_bytes``. Index and plan tensors are counted in the integer
ops (plan, defer, the flush's plan) and left out of verify and commit, where they are below
0.1%.

A trace run (``run_trace_bench``) times each recorded event instead: the buffers evolve
under the implementation as in a replay, are restored to their contents just before the
event before every sample, and a sample is one call. Bytes come from the event's own
indices and the plan and pending counts before it (``event_bytes``).

After timing, every preset row checks that outputs, records and state are finite. An
interpreter smoke run (``smoke=True``) runs a tiny shape through the same code twice per
row; its times are wall-clock times of the Triton interpreter, labelled as not
measurements, with no bandwidth figures.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from types import ModuleType
from typing import Callable, Iterator

import torch

from traces.schema import PLAN_FIELDS
from traces.tape import event_call, trace_buffers

SCHEMA = "kda-bench/1"
SMOKE_LABEL = "interpreter smoke run: timings are not measurements"
OPS = ("verify", "plan", "defer", "commit", "flush", "flush-verify", "step-stock", "step-deferred")
STEPS = {"step-stock": ("verify", "plan", "commit"), "step-deferred": ("flush-verify", "plan", "defer")}
"""The ops whose contract bytes make up a step's. A deferred step's flush and verify read
each slot once between them (``flush_verify_bytes``), whether or not an implementation
fuses them."""
STATE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
ACCEPT_MODES = ("full", "random")
MODES = ("graph", "eager")
DEFAULT_TOUCH_BYTES = 512 * 2**20
COPY_CEILING_BYTES = 2**30
_MIN_REPS = 10
_SMOKE_SETS = 2
_SMOKE_REPS = 2
_MAX_SETS = 4096
_MEMORY_FRACTION = 0.5
# Ops that write the checkpoint pool and so need it restored before every sample.
_WRITES_STATE = {"commit", "flush", "flush-verify", "step-stock", "step-deferred"}


@dataclass(frozen=True)
class Preset:
    """A model shape: heads, head dims, default window, activation dtype, gate lower bound."""

    heads: int
    head_k_dim: int
    head_v_dim: int
    spec_len: int
    activation_dtype: str
    lower_bound: float | None
    batches: tuple[int, ...]


PRESETS = {
    "k3-tp8": Preset(12, 128, 128, 8, "bfloat16", -5.0, (1, 8, 32, 64, 128, 256)),
    "tiny": Preset(2, 16, 16, 2, "bfloat16", -5.0, (1, 3)),
}


@dataclass
class BenchConfig:
    """What to run. ``impls`` are specs for ``traces.impl.load_impl``; ``touch_bytes`` is
    the state read per sample (sets ``n_sets``); ``row_seconds`` caps each row's samples."""

    preset: str = "k3-tp8"
    batches: tuple[int, ...] = ()
    spec_lens: tuple[int, ...] = ()
    state_dtype: str = "fp32"
    accept: str = "full"
    impls: tuple[str, ...] = ("triton",)
    ops: tuple[str, ...] = OPS
    mode: str = "graph"
    reps: int = 100
    row_seconds: float = 2.0
    touch_bytes: int = DEFAULT_TOUCH_BYTES
    seed: int = 0
    smoke: bool = False

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r} (known: {', '.join(PRESETS)})")
        p = PRESETS[self.preset]
        self.batches = tuple(self.batches) or p.batches
        self.spec_lens = tuple(self.spec_lens) or (p.spec_len,)
        if self.state_dtype not in STATE_DTYPES:
            raise ValueError(f"state dtype must be one of {', '.join(STATE_DTYPES)}, got {self.state_dtype!r}")
        if self.accept not in ACCEPT_MODES:
            raise ValueError(f"accept must be one of {', '.join(ACCEPT_MODES)}, got {self.accept!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not self.ops:
            raise ValueError("no ops to time")
        unknown = [op for op in self.ops if op not in OPS]
        if unknown:
            raise ValueError(f"unknown op {unknown[0]!r} (known: {', '.join(OPS)})")
        for name, values in (("batch", self.batches), ("spec-len", self.spec_lens)):
            if any(v < 1 for v in values):
                raise ValueError(f"every {name} must be a positive integer, got {list(values)}")
        if not self.impls or len(set(self.impls)) != len(self.impls):
            raise ValueError(f"implementations must be given once each, got {list(self.impls)}")
        if self.reps < 1 or self.row_seconds <= 0 or self.touch_bytes < 1:
            raise ValueError("reps, row seconds and touch bytes must be positive")


@dataclass
class Row:
    """One timed (implementation, op or step, B, T), or one trace event (``event`` is its
    index). Times are microseconds per call (one set); ``bytes`` is the contract's bytes per
    call; ``gbps`` and ``copy_fraction`` are None in a smoke run or when the row failed
    (``error`` says why)."""

    impl: str
    name: str
    batch: int
    spec_len: int
    mode: str
    n_sets: int
    count: int
    median_us: float | None
    p10_us: float | None
    p90_us: float | None
    bytes: int
    committed_tokens: int
    gbps: float | None = None
    copy_fraction: float | None = None
    error: str | None = None
    event: int | None = None

    @property
    def key(self) -> tuple:
        return (self.impl, self.name, self.batch, self.spec_len, self.event)


@dataclass
class BenchRun:
    """A whole run: what was asked, where it ran, the copy ceiling and the rows. ``interrupted``:
    stopped early (``KeyboardInterrupt``); ``rows`` then holds those finished before."""

    workload: dict
    timing: dict
    environment: dict
    copy_ceiling: dict | None
    rows: list[Row]
    label: str | None = None
    created: str = ""
    schema: str = SCHEMA
    interrupted: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


# --- bytes per call, from the contract --------------------------------------------------

@dataclass(frozen=True)
class Shape:
    """Per-head dims and element sizes in bytes."""

    heads: int
    head_k_dim: int
    head_v_dim: int
    act_bytes: int
    state_bytes: int

    @property
    def slot_bytes(self) -> int:
        return self.heads * self.head_v_dim * self.head_k_dim * self.state_bytes

    @property
    def record_token_bytes(self) -> int:
        """One token's records over all heads: fp32 correction [V] and key+gate [2K]."""
        return self.heads * (4 * self.head_v_dim + 2 * self.head_k_dim * self.act_bytes)


def verify_bytes(s: Shape, real_rows: int, total_tokens: int, record_tokens: int | None = None) -> int:
    """State read of each real row, q/k/raw_g/v/raw_beta read, outputs written, and the
    records of ``record_tokens`` tokens (default: every token) written."""
    h, k, v, a = s.heads, s.head_k_dim, s.head_v_dim, s.act_bytes
    activations = total_tokens * h * (3 * k + v + 1) * a
    outputs = total_tokens * h * v * a
    records = total_tokens if record_tokens is None else record_tokens
    return real_rows * s.slot_bytes + activations + outputs + records * s.record_token_bytes


def commit_bytes(s: Shape, commit_lens: list[int]) -> int:
    """Per row with ``n > 0``: the slot read and written, and ``n`` tokens of records read."""
    folding = [n for n in commit_lens if n > 0]
    return len(folding) * 2 * s.slot_bytes + sum(folding) * s.record_token_bytes


def plan_bytes(batch: int) -> int:
    """num_accepted, query_start_loc [B+1], state_indices read; four int32 plan columns written."""
    return 4 * (3 * batch + 1) + 4 * 4 * batch


def defer_bytes(batch: int) -> int:
    """Per row: slot, record row and commit length read; pending and commit length written."""
    return 5 * 4 * batch


def flush_bytes(s: Shape, pending: list[int]) -> int:
    """The flush plan (slot, record row, pending read; pending and four plan columns written
    per row), then a commit of each row's pending count."""
    return 8 * 4 * len(pending) + commit_bytes(s, pending)


def flush_verify_bytes(s: Shape, batch: int, spec_len: int, pending: list[int]) -> int:
    """A flush, then a verify of the same rows from the flushed slots: the flush's bytes and
    the verify's, less the second read of every slot the flush wrote."""
    flushed = sum(1 for n in pending if n > 0)
    return flush_bytes(s, pending) + verify_bytes(s, batch, batch * spec_len) - flushed * s.slot_bytes


def op_bytes(name: str, s: Shape, batch: int, spec_len: int, commit_lens: list[int]) -> int:
    """Bytes per call of an op or step for ``batch`` real rows with full windows of
    ``spec_len`` tokens and per-row commit lengths ``commit_lens`` (also the pending counts)."""
    if name in STEPS:
        return sum(op_bytes(op, s, batch, spec_len, commit_lens) for op in STEPS[name])
    return {
        "verify": lambda: verify_bytes(s, batch, batch * spec_len),
        "plan": lambda: plan_bytes(batch),
        "defer": lambda: defer_bytes(batch),
        "commit": lambda: commit_bytes(s, commit_lens),
        "flush": lambda: flush_bytes(s, commit_lens),
        "flush-verify": lambda: flush_verify_bytes(s, batch, spec_len, commit_lens),
    }[name]()


def accepted_counts(accept: str, batch: int, spec_len: int, seed: int) -> list[int]:
    """``num_accepted`` per row: ``spec_len`` each, or uniform in ``0..spec_len`` seeded by
    ``(seed, batch, spec_len)`` so that adding batch sizes does not change other draws."""
    if accept == "full":
        return [spec_len] * batch
    rng = random.Random(f"{seed}:{batch}:{spec_len}")
    return [rng.randint(0, spec_len) for _ in range(batch)]


# --- the workload -----------------------------------------------------------------------

class Workload:
    """``n_sets`` disjoint layers of one (B, T) problem on ``device`` for one implementation.

    ``run(name)`` issues one sample of an op or step; ``restore(name)`` puts back what it
    consumes (pending counts, plan columns, and the state pool when the op writes it).
    """

    def __init__(self, impl: ModuleType, preset: Preset, state_dtype: torch.dtype, batch: int, spec_len: int,
                 counts: list[int], n_sets: int, device: str, seed: int):
        H, K, V, T, B = preset.heads, preset.head_k_dim, preset.head_v_dim, spec_len, batch
        act = getattr(torch, preset.activation_dtype)
        gen = torch.Generator(device=device).manual_seed(seed)
        self.impl, self.T, self.lower_bound, self.n_sets = impl, T, preset.lower_bound, n_sets

        def randn(*size: int, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
            return (torch.randn(*size, generator=gen, device=device) * scale).to(dtype)

        tokens = B * T
        self.q = randn(n_sets, tokens, H, K, dtype=act)
        self.k = randn(n_sets, tokens, H, K, dtype=act)
        self.g = randn(n_sets, tokens, H, K, dtype=act)
        self.v = randn(n_sets, tokens, H, V, dtype=act)
        self.beta = randn(n_sets, tokens, H, dtype=act)
        self.out = torch.zeros_like(self.v)
        self.A_log = torch.log(torch.rand(H, generator=gen, device=device) * 15 + 1)
        self.dt_bias = randn(H * K, dtype=torch.float32, scale=0.5)
        self.pool = randn(1 + n_sets * B, H, V, K, dtype=state_dtype, scale=0.1)
        self.pool[0].zero_()
        self.pristine_pool = self.pool.clone()
        self.qsl = torch.arange(0, tokens + 1, T, dtype=torch.int32, device=device)
        self.slots = torch.arange(1, 1 + n_sets * B, dtype=torch.int32, device=device).view(n_sets, B)
        self.record_rows = torch.arange(B, dtype=torch.int32, device=device)
        n = torch.tensor(counts, dtype=torch.int32, device=device).clamp(0, T)
        self.num_accepted = n.repeat(n_sets, 1)
        self.records = impl.allocate_records(n_sets * B, H, T, K, V, act, device)
        self.records.correction.copy_(randn(*self.records.correction.shape, dtype=torch.float32, scale=0.1))
        self.records.key_gate.copy_(randn(*self.records.key_gate.shape, dtype=act))
        # Stock plan (docs/design.md §6) for real rows: fold n in place, no boundary.
        folds = (self.num_accepted > 0).to(torch.int32)
        self.pristine_plan = torch.stack([self.num_accepted * folds, self.slots * folds,
                                          torch.zeros_like(self.slots), torch.zeros_like(self.slots)])
        self.plan_columns = self.pristine_plan.clone()
        self.pristine_pending = self.num_accepted.clone()
        self.pending = self.pristine_pending.clone()

        records_type = type(self.records)
        self.sets = []
        for s in range(n_sets):
            rows = slice(s * B, (s + 1) * B)
            self.sets.append(dict(
                q=self.q[s:s + 1], k=self.k[s:s + 1], g=self.g[s:s + 1], v=self.v[s:s + 1],
                beta=self.beta[s:s + 1], out=self.out[s:s + 1], slots=self.slots[s],
                accepted=self.num_accepted[s], pending=self.pending[s],
                records=records_type(correction=self.records.correction[rows], key_gate=self.records.key_gate[rows]),
                plan=impl.CommitPlan(*(self.plan_columns[c, s] for c in range(4))),
            ))

    def _verify(self, d: dict, record_indices: torch.Tensor | None) -> None:
        self.impl.kda_recoverssm_verify(
            d["q"], d["k"], d["v"], d["g"], d["beta"], self.A_log, self.dt_bias, self.lower_bound, self.pool,
            d["records"], self.qsl, d["slots"], self.T, out=d["out"], record_indices=record_indices)

    def _plan(self, d: dict) -> None:
        self.impl.kda_recoverssm_plan(d["plan"], d["accepted"], self.qsl, d["slots"], self.T)

    def _defer(self, d: dict) -> None:
        self.impl.kda_recoverssm_defer(d["plan"], d["slots"], self.record_rows, d["pending"])

    def _commit(self, d: dict) -> None:
        self.impl.kda_recoverssm_commit(self.pool, d["records"], self.A_log, self.dt_bias, self.lower_bound,
                                        d["slots"], d["plan"])

    def _flush(self, d: dict) -> None:
        self.impl.kda_recoverssm_flush(self.pool, d["records"], self.A_log, self.dt_bias, self.lower_bound,
                                       d["slots"], self.record_rows, d["pending"], d["plan"])

    def _plan_deferred(self, d: dict) -> None:
        """The fused call where the implementation has it, else a plan and then a deferral."""
        if not hasattr(self.impl, "kda_recoverssm_plan_deferred"):
            self._plan(d)
            self._defer(d)
            return
        self.impl.kda_recoverssm_plan_deferred(d["plan"], d["accepted"], self.qsl, d["slots"], self.T,
                                               self.record_rows, d["pending"])

    def _flush_verify(self, d: dict) -> None:
        """The fused call where the implementation has it, else a flush and then a verify."""
        if not hasattr(self.impl, "kda_recoverssm_flush_verify"):
            self._flush(d)
            self._verify(d, self.record_rows)
            return
        self.impl.kda_recoverssm_flush_verify(
            d["q"], d["k"], d["v"], d["g"], d["beta"], self.A_log, self.dt_bias, self.lower_bound, self.pool,
            d["records"], self.qsl, d["slots"], self.T, self.record_rows, d["pending"], d["plan"], out=d["out"])

    def run(self, name: str) -> None:
        """One sample of ``name``: the op (or step) over every set, in decode-step order."""
        sets = self.sets
        if name == "step-stock":
            for d in sets:
                self._verify(d, None)
            for d in sets:
                self._plan(d)
                self._commit(d)
        elif name == "step-deferred":
            for d in sets:
                self._flush_verify(d)
            for d in sets:
                self._plan_deferred(d)
        else:
            op = {"verify": lambda d: self._verify(d, None), "plan": self._plan, "defer": self._defer,
                  "commit": self._commit, "flush": self._flush, "flush-verify": self._flush_verify}[name]
            for d in sets:
                op(d)

    def restore(self, name: str) -> None:
        """Put back the pending counts and plan columns, and the state pool if ``name`` writes it."""
        self.plan_columns.copy_(self.pristine_plan)
        self.pending.copy_(self.pristine_pending)
        if name in _WRITES_STATE:
            self.pool.copy_(self.pristine_pool)

    def finite(self) -> bool:
        """Whether outputs, records and the state pool hold no NaN or Inf."""
        return all(bool(torch.isfinite(t).all()) for t in
                   (self.out, self.pool, self.records.correction, self.records.key_gate))


def set_bytes(preset: Preset, state_dtype: torch.dtype, batch: int, spec_len: int) -> int:
    """Device memory of one set, its pristine state copy included."""
    act = getattr(torch, preset.activation_dtype).itemsize
    s = Shape(preset.heads, preset.head_k_dim, preset.head_v_dim, act, state_dtype.itemsize)
    tokens = batch * spec_len
    activations = tokens * preset.heads * (3 * preset.head_k_dim + 2 * preset.head_v_dim + 1) * act
    return 2 * batch * s.slot_bytes + tokens * s.record_token_bytes + activations


def choose_sets(slot_bytes: int, batch: int, touch_bytes: int, per_set_bytes: int, free_bytes: int | None) -> int:
    """Sets needed to read ``touch_bytes`` of state per sample, capped by memory and ``_MAX_SETS``."""
    wanted = max(2, math.ceil(touch_bytes / (batch * slot_bytes)))
    if free_bytes is not None:
        wanted = min(wanted, max(1, int(free_bytes * _MEMORY_FRACTION) // per_set_bytes))
    return min(wanted, _MAX_SETS)


# --- timers -----------------------------------------------------------------------------

class CudaTimer:
    """CUDA-event timing. Before each sample, untimed: ``prepare``, then an L2 flush that reads
    a scratch buffer of at least four L2 sizes (a read leaves only clean lines, so no
    write-back spills into the timed region), then, for eager calls only, a device
    synchronisation so that launch overhead is measured and not hidden behind the flush."""

    def __init__(self, device: str):
        props = torch.cuda.get_device_properties(device)
        self.l2_bytes = int(getattr(props, "L2_cache_size", 60 * 2**20))
        self.scratch = torch.zeros(max(4 * self.l2_bytes, 256 * 2**20), dtype=torch.uint8, device=device)

    def samples(self, fn: Callable[[], None], prepare: Callable[[], None], reps: int, synchronize: bool) -> list[float]:
        """Seconds of ``fn`` per sample, between two CUDA events on the current stream."""
        events = []
        for _ in range(reps):
            prepare()
            self.scratch.sum()
            if synchronize:
                torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
        return [start.elapsed_time(end) * 1e-3 for start, end in events]


class WallTimer:
    """Wall-clock timing for smoke runs on the CPU (nothing to flush or synchronise)."""

    l2_bytes = 0

    def samples(self, fn: Callable[[], None], prepare: Callable[[], None], reps: int, synchronize: bool) -> list[float]:
        times = []
        for _ in range(reps):
            prepare()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return times


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated ``q``-th percentile (0..100) of a non-empty list."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def measure_copy_ceiling(device: str, nbytes: int = COPY_CEILING_BYTES, reps: int = 20) -> dict:
    """Median time of a device-to-device copy of ``nbytes``; GB/s counts bytes read plus written."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    events = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) * 1e-3 for s, e in events]
    median = percentile(times, 50)
    del src, dst
    torch.cuda.empty_cache()
    return {"bytes": 2 * nbytes, "median_us": median * 1e6, "gbps": 2 * nbytes / median / 1e9, "count": reps}


class SyncError(RuntimeError):
    """The implementation synchronised with the host, so it cannot run inside a CUDA graph."""


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Within: Ctrl-C and SIGTERM wait, then stop the run (``KeyboardInterrupt``) as the block
    ends, so that a CUDA graph capture is never cut half way (the stream would be left
    capturing). Only in the main thread, where signal handlers run; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, lambda signum, frame: arrived.append(signum)) for sig in held}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if arrived:
        raise KeyboardInterrupt


def warm_and_capture(run: Callable[[], None], restore: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """Warm up on a side stream (compiles kernels), check that no call synchronises with the
    host, then capture ``run`` in a CUDA graph. Nothing is timed here."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        restore()
        run()
        restore()
        failure = None
        torch.cuda.set_sync_debug_mode("error")
        try:
            run()
        except RuntimeError as exc:
            failure = exc
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    if failure is not None:
        raise SyncError(f"synchronises with the host, so it cannot run in a CUDA graph (use --eager): {failure}")
    graph = torch.cuda.CUDAGraph()
    with interrupts_held(), torch.cuda.graph(graph):
        run()
    torch.cuda.synchronize()
    return graph


def _time_calls(run: Callable[[], None], restore: Callable[[], None], calls: int, timer, config: BenchConfig,
                mode: str) -> list[float]:
    """Per-call seconds of each sample of ``run`` (which makes ``calls`` calls); ``restore``
    runs untimed before every sample. ``mode`` is ``graph`` or ``eager``."""
    if mode == "graph":
        fn = warm_and_capture(run, restore).replay
    else:
        fn = run
        restore()
        fn()
    if config.smoke:
        reps = _SMOKE_REPS
    else:
        t0 = time.perf_counter()
        timer.samples(fn, restore, 1, mode == "eager")
        estimate = time.perf_counter() - t0
        reps = max(min(config.reps, _MIN_REPS), min(config.reps, int(config.row_seconds / max(estimate, 1e-9))))
    return [t / calls for t in timer.samples(fn, restore, reps, mode == "eager")]


def _fill_times(row: "Row", times: list[float], ceiling: dict | None) -> None:
    row.count = len(times)
    row.median_us, row.p10_us, row.p90_us = (percentile(times, q) * 1e6 for q in (50, 10, 90))
    if ceiling is not None:
        row.gbps = row.bytes / (row.median_us * 1e-6) / 1e9
        row.copy_fraction = row.gbps / ceiling["gbps"]


def _start(config: BenchConfig, device: str, progress: Callable[[str], None]):
    """Load the implementations; pick the timer and the call mode; measure the copy ceiling."""
    from traces.impl import load_impl

    impls = {spec: load_impl(spec) for spec in config.impls}
    cuda = device.startswith("cuda")
    mode = "smoke" if config.smoke else config.mode
    calls = "graph" if mode == "graph" and cuda else "eager"
    timer = CudaTimer(device) if cuda else WallTimer()
    ceiling = None
    if cuda and not config.smoke:
        progress("measuring the device-to-device copy ceiling")
        ceiling = measure_copy_ceiling(device)
    return impls, cuda, mode, calls, timer, ceiling


def impl_routes(impls: dict) -> dict[str, dict[str, str]]:
    """Per implementation spec: op -> the implementation it runs through (``traces.surface``)."""
    from traces.surface import op_routes

    return {spec: op_routes(impl, spec) for spec, impl in impls.items()}


def _timing(config: BenchConfig, mode: str, timer) -> dict:
    return {
        "mode": mode, "max_reps": config.reps, "row_seconds": config.row_seconds,
        "touch_bytes": config.touch_bytes, "l2_bytes": timer.l2_bytes,
        "method": "per sample, untimed: restore consumed buffers (state pool, pending, plan), read a scratch "
                  "buffer of >= 4x L2 (eager: then synchronise); timed with CUDA events: one graph replay "
                  "(or the eager calls) over n_sets disjoint sets; reported per call (divided by n_sets)",
    }


def _finished(rows: list[Row]) -> list[Row]:
    """The rows of an interrupted run that were timed or failed, not the one in flight."""
    return [r for r in rows if r.median_us is not None or r.error is not None]


def run_bench(config: BenchConfig, device: str, progress: Callable[[str], None] = lambda _: None) -> BenchRun:
    """Time every (T, B, implementation, op) of ``config`` on ``device``.

    ``device`` is ``cuda`` for measurements; a smoke run may use the CPU (Triton interpreter).
    A row that cannot be timed keeps its place with ``error`` set and no times. On
    ``KeyboardInterrupt`` it stops and returns the rows finished so far, ``interrupted``.
    """
    from traces.provenance import environment

    preset = PRESETS[config.preset]
    state_dtype = STATE_DTYPES[config.state_dtype]
    act = getattr(torch, preset.activation_dtype)
    shape = Shape(preset.heads, preset.head_k_dim, preset.head_v_dim, act.itemsize, state_dtype.itemsize)
    impls, cuda, mode, calls, timer, ceiling = _start(config, device, progress)

    rows: list[Row] = []
    try:
        for T in config.spec_lens:
            for B in config.batches:
                counts = accepted_counts(config.accept, B, T, config.seed)
                commit_lens = [min(n, T) for n in counts]
                if config.smoke:
                    n_sets = _SMOKE_SETS
                else:
                    free = torch.cuda.mem_get_info(device)[0] if cuda else None
                    n_sets = choose_sets(shape.slot_bytes, B, config.touch_bytes,
                                         set_bytes(preset, state_dtype, B, T), free)
                for spec, impl in impls.items():
                    try:
                        work = Workload(impl, preset, state_dtype, B, T, counts, n_sets, device, config.seed)
                    except (RuntimeError, ValueError, TypeError) as exc:
                        work, setup_error = None, f"workload set-up failed: {type(exc).__name__}: {exc}"
                    for name in config.ops:
                        nbytes = op_bytes(name, shape, B, T, commit_lens)
                        row = Row(spec, name, B, T, mode, n_sets, 0, None, None, None, nbytes, sum(commit_lens))
                        rows.append(row)
                        if work is None:
                            row.error = setup_error
                            continue
                        progress(f"{spec} {name} B={B} T={T} ({n_sets} sets)")
                        try:
                            times = _time_calls(lambda: work.run(name), lambda: work.restore(name), n_sets, timer,
                                                config, calls)
                            if not work.finite():
                                raise RuntimeError("non-finite values in outputs, records or state")
                        except Exception as exc:  # a failed row is reported, never timed wrongly
                            row.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
                            progress(f"{spec} {name} B={B} T={T}: {row.error}")
                            continue
                        _fill_times(row, times, ceiling)
                    del work
                    if cuda:
                        torch.cuda.empty_cache()
    except KeyboardInterrupt:  # keep what is finished; the row in flight has neither times nor error
        rows = _finished(rows)
        interrupted = True
    else:
        interrupted = False

    workload = {
        "preset": config.preset, "heads": preset.heads, "head_k_dim": preset.head_k_dim,
        "head_v_dim": preset.head_v_dim, "activation_dtype": preset.activation_dtype,
        "state_dtype": str(state_dtype).removeprefix("torch."), "lower_bound": preset.lower_bound,
        "accept": config.accept, "seed": config.seed, "batches": list(config.batches),
        "spec_lens": list(config.spec_lens), "impls": list(config.impls), "ops": list(config.ops),
        "routes": impl_routes(impls),
    }
    return BenchRun(workload=workload, timing=_timing(config, mode, timer), environment=environment(),
                    copy_ceiling=ceiling, rows=rows, label=SMOKE_LABEL if config.smoke else None,
                    interrupted=interrupted,
                    created=datetime.now(timezone.utc).isoformat(timespec="seconds"))


# --- trace events -----------------------------------------------------------------------

def event_bytes(op: str, s: Shape, T: int, x: dict, plan: dict, pending: list[int]) -> tuple[int, int]:
    """Contract bytes of one trace event and the tokens it folds into state.

    ``x``: the event's index inputs as lists (``query_start_loc``, ``state_indices``,
    ``record_indices``/``record_rows`` when present); ``plan``: the plan columns before the
    event (``PLAN_FIELDS`` -> list); ``pending``: the pending counts before the event.
    """
    slots = x["state_indices"]
    B = len(slots)
    if op == "verify":
        qsl = x["query_start_loc"]
        lens = [min(max(qsl[b + 1] - qsl[b], 0), T) for b in range(B)]
        rec = x.get("record_indices") or list(range(B))
        real = sum(1 for b in range(B) if slots[b] > 0 and lens[b] > 0)
        record_tokens = sum(lens[b] for b in range(B) if slots[b] > 0 and rec[b] >= 0)
        return verify_bytes(s, real, qsl[-1], record_tokens), 0
    if op == "plan":
        return plan_bytes(B), 0
    if op == "defer":
        return defer_bytes(B), 0
    if op == "commit":
        rec = x.get("record_indices") or list(range(B))
        total = folded = 0
        for b in range(B):
            n = min(plan["commit_lens"][b], T)
            if n <= 0 or slots[b] <= 0 or rec[b] < 0:
                continue
            written = (plan["final_state_indices"][b] > 0) + (
                plan["boundary_state_indices"][b] > 0 and 1 <= plan["boundary_recovery_lens"][b] <= n)
            total += (1 + written) * s.slot_bytes + n * s.record_token_bytes
            folded += n
        return total, folded
    rows, left, counts = x["record_rows"], list(pending), []
    for b in range(B):
        live = slots[b] > 0 and rows[b] >= 0
        counts.append(min(max(left[rows[b]], 0), T) if live else 0)
        if live:
            left[rows[b]] = 0
    return flush_bytes(s, counts), sum(counts)


class TraceState:
    """A trace's buffers on ``device``, evolving under ``impl``'s ops, and each event's call."""

    def __init__(self, trace, impl: ModuleType, device: str):
        m = trace.manifest
        self.trace, self.impl, self.device, self.T, self.lower_bound = trace, impl, device, m.dims.T, m.lower_bound
        self.bufs = trace_buffers(trace, impl, device)
        self.buffers = self.bufs.as_roles()

    def snapshot(self) -> dict[str, torch.Tensor]:
        return {role: t.clone() for role, t in self.buffers.items()}

    def restore(self, snap: dict[str, torch.Tensor]) -> None:
        for role, t in self.buffers.items():
            t.copy_(snap[role])

    def call(self, op: str, x: dict[str, torch.Tensor], attrs: dict) -> Callable[[], None]:
        """The event's call on the evolving buffers; a verify writes into a fresh output."""
        out = torch.zeros_like(x["v"]) if op == "verify" else None
        return event_call(self.impl, op, x, attrs, self.bufs, self.T, self.lower_bound, out=out)


def run_trace_bench(trace, config: BenchConfig, device: str,
                    progress: Callable[[str], None] = lambda _: None) -> BenchRun:
    """Time each event of an opened trace (``traces.io.read_trace``) through each implementation.

    The buffers evolve under each implementation as in a replay. Before every sample of
    event ``i`` they are restored to their contents just before ``i`` (untimed, then L2 is
    flushed); after timing, the event runs once more from there to advance the buffers. A
    sample is one call (``n_sets`` = 1). An event that fails leaves the rest of that
    implementation's events untimed.
    """
    from traces.provenance import environment

    m = trace.manifest
    act, state = getattr(torch, m.activation_dtype), getattr(torch, m.state_dtype)
    shape = Shape(m.dims.H, m.dims.K, m.dims.V, act.itemsize, state.itemsize)
    impls, cuda, mode, calls, timer, ceiling = _start(config, device, progress)
    index_roles = ("query_start_loc", "state_indices", "record_indices", "record_rows")
    rows: list[Row] = []
    try:
        for spec, impl in impls.items():
            broken, st = None, None
            try:
                st = TraceState(trace, impl, device)
            except (RuntimeError, ValueError, TypeError) as exc:
                broken = f"trace set-up failed: {type(exc).__name__}: {exc}"
            for i, event in enumerate(trace.events):
                host = {role: trace.tensor(name).tolist() for role, name in event.inputs.items() if role in index_roles}
                row = Row(spec, event.op, len(host["state_indices"]), m.dims.T, mode, 1, 0, None, None, None, 0, 0,
                          event=i)
                rows.append(row)
                if broken is not None:
                    row.error = broken
                    continue
                snap = st.snapshot()
                plan = {f: snap[f"plan.{f}"].tolist() for f in PLAN_FIELDS}
                row.bytes, row.committed_tokens = event_bytes(event.op, shape, m.dims.T, host, plan,
                                                              snap["pending"].tolist())
                progress(f"{spec} event {i} {event.op} B={row.batch}")
                try:
                    x = {role: t.to(device) for role, t in trace.tensors(event.inputs).items()}
                    call = st.call(event.op, x, event.attrs)
                    times = _time_calls(call, lambda: st.restore(snap), 1, timer, config, calls)
                    _fill_times(row, times, ceiling)
                    st.restore(snap)
                    call()
                except Exception as exc:  # the buffers can no longer follow the trace
                    row.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
                    progress(f"{spec} event {i} {event.op}: {row.error}")
                    broken = f"not timed: event {i} failed"
            st = None
            if cuda:
                torch.cuda.empty_cache()
    except KeyboardInterrupt:
        rows = _finished(rows)
        interrupted = True
    else:
        interrupted = False
    workload = {
        "trace": str(trace.path), "events": len(trace.events), "heads": m.dims.H, "head_k_dim": m.dims.K,
        "head_v_dim": m.dims.V, "spec_lens": [m.dims.T], "activation_dtype": m.activation_dtype,
        "state_dtype": m.state_dtype, "lower_bound": m.lower_bound, "impls": list(config.impls),
        "routes": impl_routes(impls),
    }
    timing = {**_timing(config, mode, timer), "method": (
        "per event and sample, untimed: restore every buffer to its contents before the event, read a scratch "
        "buffer of >= 4x L2 (eager: then synchronise); timed with CUDA events: one graph replay (or eager call) "
        "of the event's one call")}
    return BenchRun(workload=workload, timing=timing, environment=environment(), copy_ceiling=ceiling, rows=rows,
                    label=SMOKE_LABEL if config.smoke else None, interrupted=interrupted,
                    created=datetime.now(timezone.utc).isoformat(timespec="seconds"))


# --- results: ratios, save, load, compare, plot -------------------------------------------

def impl_ratios(run: BenchRun) -> dict[tuple, float]:
    """Each row's median over the first implementation's median for the same (op, B, T, event)."""
    first = run.workload["impls"][0]
    base = {r.key[1:]: r.median_us for r in run.rows if r.impl == first}
    ratios = {}
    for r in run.rows:
        b = base.get(r.key[1:])
        if r.median_us is not None and b:
            ratios[r.key] = r.median_us / b
    return ratios


def save_run(run: BenchRun, path: str) -> None:
    """Write ``run`` as JSON to ``path`` whole or not at all: into a file beside it, then renamed
    over it, so that an interrupted save leaves no half-written file."""
    partial = f"{path}.partial-{os.getpid()}"
    try:
        with open(partial, "w") as f:
            json.dump(run.to_dict(), f, indent=1)
            f.write("\n")
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def load_run(path: str) -> BenchRun:
    """Read a saved run; ``ValueError`` names what is wrong with the file."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"{path} is not a kda bench result (expected schema {SCHEMA!r})")
    try:
        rows = [Row(**r) for r in data["rows"]]
        return BenchRun(workload=data["workload"], timing=data["timing"], environment=data["environment"],
                        copy_ceiling=data["copy_ceiling"], rows=rows, label=data.get("label"),
                        created=data.get("created", ""), schema=data["schema"],
                        interrupted=bool(data.get("interrupted", False)))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: malformed kda bench result ({exc})") from exc


@dataclass
class Comparison:
    """Per-row time ratios (current median / base median; < 1 is faster) and their geometric mean."""

    rows: list[dict] = field(default_factory=list)
    geomean: float | None = None
    unmatched: int = 0


def compare_runs(current: BenchRun, base: BenchRun) -> Comparison:
    """Match rows on (impl, op, B, T, event); rows without a time on either side count as unmatched."""
    base_rows = {r.key: r for r in base.rows if r.median_us}
    result = Comparison()
    for r in current.rows:
        b = base_rows.get(r.key)
        if b is None or not r.median_us:
            result.unmatched += 1
            continue
        result.rows.append({"impl": r.impl, "name": r.name, "batch": r.batch, "spec_len": r.spec_len,
                            "event": r.event, "base_us": b.median_us, "us": r.median_us,
                            "ratio": r.median_us / b.median_us})
    if result.rows:
        result.geomean = math.exp(sum(math.log(x["ratio"]) for x in result.rows) / len(result.rows))
    return result


def plot_run(run: BenchRun, path: str) -> None:
    """Achieved GB/s against batch size for every op and step that moves state, one line
    per (implementation, op, T), with the copy ceiling as a dashed line. Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    lines: dict[tuple, list[tuple[int, float]]] = {}
    for r in run.rows:
        if r.gbps is not None and r.name not in ("plan", "defer"):
            lines.setdefault((r.impl, r.name, r.spec_len), []).append((r.batch, r.gbps))
    for (impl, name, T), points in sorted(lines.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"{impl} {name} T={T}")
    if run.copy_ceiling:
        ax.axhline(run.copy_ceiling["gbps"], linestyle="--", color="gray", label="D2D copy ceiling")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch (rows)")
    ax.set_ylabel("achieved GB/s")
    ax.set_title(f"kda bench {run.workload['preset']} state {run.workload['state_dtype']} ({run.timing['mode']})")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
