"""Recording the kernel calls of a live process into a trace (format v1).

``Recorder(path, impl)`` exposes the kernel API of ``impl`` (``kernels`` by default; any
spec ``traces.impl.load_impl`` accepts, or a module object) and forwards every call to it.
Each recorded call becomes one event:

- before the call, its inputs and the first-seen contents of every buffer region it may
  touch (state slots, record rows; pending counts, plan and parameters whole; whole pools
  with ``snapshot="all"``) are written to ``<path>.shards/NNNNNN.in.safetensors``;
- after it returns, its results (the event's expected tensors, as ``kda replay``
  compares them) go to ``NNNNNN.out.safetensors``.

Shards are written atomically, so a process that dies leaves every completed event (and
the inputs of the call it died in) on disk; ``close()`` (or ``kda record merge``) merges
them into one trace: initial buffers assembled from the first-seen contents (zeros where
nothing was seen), events in order. A trace holds one set of buffers: the first pool,
records, pending counts, plan and parameters the recorder sees are bound, and calls on
other buffers (another layer) are passed through unrecorded and counted.

Inside a CUDA graph capture (``capturing``) the recorder touches nothing on the host: each
call is forwarded as it is, so the graph captures what it would without the recorder, and
counted in ``skipped_calls`` as ``captured`` (one line on stderr says how to record those
steps: run the engine eagerly). A program that was not edited is recorded by patching its
modules (``traces.patch``).

``record_trace(path, ...)`` is the context-manager form. ``api()`` is the hook a process
uses to get the kernel API: the plain implementation, or, when ``KDA_RECORD`` names a
trace file, a process-wide recorder closed at exit (options: ``KDA_RECORD_IMPL``,
``KDA_RECORD_OPS``, ``KDA_RECORD_MAX_EVENTS``, ``KDA_RECORD_MAX_MB``, ``KDA_RECORD_SNAPSHOT``).
"""

from __future__ import annotations

import atexit
import os
import shlex
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import torch

from traces.schema import NULL_ID, OPS, PLAN_FIELDS
from traces.shards import MergeResult, RecordError, merge_shards, save_shard
from traces.validate import dtype_name

SNAPSHOTS = ("touched", "all")
ENV_PATH = "KDA_RECORD"


CAPTURED_NOTE = ("kda record: calls inside a CUDA graph capture are passed through and not recorded, nor are "
                 "the graph's replays; to record those steps run the engine eagerly (e.g. vLLM's --enforce-eager)")


def capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (the host must not touch it)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def shards_dir(path: str | os.PathLike) -> Path:
    """Where the shards of trace ``path`` are spilled: ``<path>.shards``."""
    p = Path(path)
    return p.with_name(p.name + ".shards")


class Recorder:
    """The kernel API of ``impl``, recording every call into ``path`` (see the module docstring).

    ``ops`` keeps only those ops (note: the buffers then change between kept events
    without a record, so such a trace replays exactly only where nothing skipped touched
    the same slots). ``max_events`` and ``max_bytes`` stop recording once reached (the
    byte cap counts shard bytes; the event that crosses it is still completed). Other
    attributes (buffer classes, ``NULL_BLOCK_ID``) come from ``impl``.
    """

    def __init__(self, path: str | os.PathLike, impl: str | ModuleType = "kernels", *, snapshot: str = "touched",
                 ops: tuple[str, ...] | list[str] | None = None, max_events: int | None = None,
                 max_bytes: int | None = None):
        if snapshot not in SNAPSHOTS:
            raise RecordError(f"snapshot {snapshot!r}: expected one of {', '.join(SNAPSHOTS)}")
        unknown = [op for op in ops or () if op not in OPS]
        if unknown:
            raise RecordError(f"ops: {', '.join(unknown)} not among {', '.join(OPS)}")
        for name, cap in (("max_events", max_events), ("max_bytes", max_bytes)):
            if cap is not None and cap < 1:
                raise RecordError(f"{name} must be positive, got {cap}")
        if isinstance(impl, str):
            from traces.impl import ImplError, load_impl

            try:
                self.impl, impl_name = load_impl(impl), impl
            except ImplError as exc:
                raise RecordError(str(exc)) from None
        else:
            self.impl, impl_name = impl, impl.__name__
        self.path = Path(path)
        self.shards = shards_dir(self.path)
        if self.shards.exists():
            raise RecordError(f"{self.shards} exists: merge it (kda record merge) or remove it first")
        self.shards.mkdir(parents=True)
        self.snapshot, self.ops = snapshot, tuple(ops) if ops else OPS
        self.max_events, self.max_bytes = max_events, max_bytes
        self.events = self.bytes = 0
        self.skipped: dict[str, int] = {}
        self.stopped: str | None = None
        self.closed = False
        self._bound: dict[str, torch.Tensor] = {}
        self._lower_bound: tuple[float | None] | None = None
        self._seen_slots: set[int] = set()
        self._seen_rows: set[int] = set()
        self._seen_whole: set[str] = set()
        self._max_batch = 1
        from traces.provenance import trace_provenance

        self.provenance: dict[str, Any] = trace_provenance(
            "kda record", command=shlex.join(sys.argv), impl=impl_name, snapshot=snapshot, ops=list(self.ops),
            started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), pid=os.getpid())

    def __getattr__(self, name: str) -> Any:
        if name == "impl":  # not set yet: never recurse
            raise AttributeError(name)
        return getattr(self.impl, name)

    # -- the kernel API ---------------------------------------------------------------

    def kda_recoverssm_verify(self, q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, checkpoint_state,
                              records, query_start_loc, state_indices, spec_query_len, out=None, record_indices=None):
        def run():
            return self.impl.kda_recoverssm_verify(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound,
                                                   checkpoint_state, records, query_start_loc, state_indices,
                                                   spec_query_len, out=out, record_indices=record_indices)

        bind = {"checkpoint_state": checkpoint_state, **_records(records), **_params(A_log, dt_bias)}
        if not self._wants("verify", bind, lower_bound, spec_query_len):
            return run()
        rows = _rows_or_default(record_indices, state_indices)
        event = self._begin("verify", {"q": q, "k": k, "v": v, "raw_g": raw_g, "raw_beta": raw_beta,
                                       "query_start_loc": query_start_loc, "state_indices": state_indices,
                                       "record_indices": record_indices}, {}, state_indices, rows, bind, (lower_bound,))
        result = self._call(event, run)
        written = rows.long().clamp(min=0)
        self._end(event, {"out": result, "records.correction": records.correction[written],
                          "records.key_gate": records.key_gate[written]})
        return result

    def kda_recoverssm_plan(self, plan, num_accepted, query_start_loc, state_indices, spec_query_len,
                            block_table=None, num_computed=None, block_size=None):
        def run():
            return self.impl.kda_recoverssm_plan(plan, num_accepted, query_start_loc, state_indices, spec_query_len,
                                                 block_table, num_computed, block_size)

        bind = _plan(plan)
        if not self._wants("plan", bind, None, spec_query_len, lower_bound_used=False):
            return run()
        attrs = {"block_size": int(block_size)} if block_table is not None else {}
        event = self._begin("plan", {"num_accepted": num_accepted, "query_start_loc": query_start_loc,
                                     "state_indices": state_indices, "block_table": block_table,
                                     "num_computed": num_computed}, attrs, None, None, bind)
        result = self._call(event, run)
        B = state_indices.shape[0]
        self._end(event, {f: getattr(plan, f)[:B] for f in PLAN_FIELDS})
        return result

    def kda_recoverssm_defer(self, plan, state_indices, record_rows, pending, eager=None):
        def run():
            return self.impl.kda_recoverssm_defer(plan, state_indices, record_rows, pending, eager)

        bind = {**_plan(plan), "pending": pending}
        if not self._wants("defer", bind, None, None, lower_bound_used=False):
            return run()
        event = self._begin("defer", {"state_indices": state_indices, "record_rows": record_rows, "eager": eager},
                            {}, None, None, bind)
        result = self._call(event, run)
        self._end(event, {"pending": pending, "commit_lens": plan.commit_lens[: state_indices.shape[0]]})
        return result

    def kda_recoverssm_commit(self, checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, plan,
                              record_indices=None):
        def run():
            return self.impl.kda_recoverssm_commit(checkpoint_state, records, A_log, dt_bias, lower_bound,
                                                   state_indices, plan, record_indices)

        bind = {"checkpoint_state": checkpoint_state, **_records(records), **_params(A_log, dt_bias), **_plan(plan)}
        if not self._wants("commit", bind, lower_bound, None):
            return run()
        rows = _rows_or_default(record_indices, state_indices)
        targets = written_slots(plan, state_indices, rows)
        touched = torch.cat([state_indices.reshape(-1).cpu().long(), targets])
        event = self._begin("commit", {"state_indices": state_indices, "record_indices": record_indices}, {},
                            touched, rows, bind, (lower_bound,))
        result = self._call(event, run)
        self._end(event, _states(checkpoint_state, targets))
        return result

    def kda_recoverssm_flush(self, checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, record_rows,
                             pending, plan):
        def run():
            return self.impl.kda_recoverssm_flush(checkpoint_state, records, A_log, dt_bias, lower_bound,
                                                  state_indices, record_rows, pending, plan)

        bind = {"checkpoint_state": checkpoint_state, **_records(records), **_params(A_log, dt_bias),
                **_plan(plan), "pending": pending}
        if not self._wants("flush", bind, lower_bound, None):
            return run()
        event = self._begin("flush", {"state_indices": state_indices, "record_rows": record_rows}, {},
                            state_indices, record_rows, bind, (lower_bound,))
        result = self._call(event, run)
        self._end(event, {**_states(checkpoint_state, written_slots(plan, state_indices, record_rows)),
                          "pending": pending})
        return result

    def kda_recoverssm_flush_verify(self, q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, checkpoint_state,
                                    records, query_start_loc, state_indices, spec_query_len, record_rows, pending,
                                    plan, out=None):
        """Recorded as what it stands for, a flush and then a verify of the same rows: two
        events, run as two calls so that the state between them is observed."""
        if capturing():  # the graph gets the fused call, as without the recorder
            self.skip("captured")
            return self.impl.kda_recoverssm_flush_verify(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound,
                                                         checkpoint_state, records, query_start_loc, state_indices,
                                                         spec_query_len, record_rows, pending, plan, out=out)
        self.kda_recoverssm_flush(checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, record_rows,
                                  pending, plan)
        return self.kda_recoverssm_verify(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, checkpoint_state,
                                          records, query_start_loc, state_indices, spec_query_len, out=out,
                                          record_indices=record_rows)

    def kda_recoverssm_plan_deferred(self, plan, num_accepted, query_start_loc, state_indices, spec_query_len,
                                     record_rows, pending, eager=None, block_table=None, num_computed=None,
                                     block_size=None):
        """Recorded as what it stands for, a plan and then a deferral: two events."""
        if capturing():
            self.skip("captured")
            return self.impl.kda_recoverssm_plan_deferred(plan, num_accepted, query_start_loc, state_indices,
                                                          spec_query_len, record_rows, pending, eager, block_table,
                                                          num_computed, block_size)
        rows = self.kda_recoverssm_plan(plan, num_accepted, query_start_loc, state_indices, spec_query_len,
                                        block_table, num_computed, block_size)
        self.kda_recoverssm_defer(plan, state_indices, record_rows, pending, eager)
        return rows

    # -- recording --------------------------------------------------------------------

    def _wants(self, op: str, bind: dict[str, torch.Tensor], lower_bound, spec_query_len,
               lower_bound_used: bool = True) -> bool:
        """Whether to record this call: not inside a CUDA graph capture (``capturing``),
        recording, op kept, and the buffers the bound ones."""
        if capturing():
            self.skip("captured")
            return False
        if self.closed or self.stopped or op not in self.ops:
            self.skipped[op] = self.skipped.get(op, 0) + 1
            return False
        same = all(_same(self._bound[r], t) for r, t in bind.items() if r in self._bound)
        if lower_bound_used and self._lower_bound is not None:
            same = same and self._lower_bound == (lower_bound,)
        correction = self._bound.get("records.correction")
        if spec_query_len is not None and correction is not None:
            same = same and correction.shape[2] == spec_query_len
        if not same:
            self.skipped[op] = self.skipped.get(op, 0) + 1
            return False
        return True

    def skip(self, reason: str) -> None:
        """Count a call passed through unrecorded under ``reason`` (``skipped_calls``); the
        first captured one says on stderr how captured steps can be recorded."""
        if reason == "captured" and "captured" not in self.skipped:
            print(CAPTURED_NOTE, file=sys.stderr)
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def closing_provenance(self) -> dict[str, Any]:
        """Provenance known only once recording ends (none here; see ``traces.patch``)."""
        return {}

    def _begin(self, op: str, inputs: dict[str, torch.Tensor | None], attrs: dict, slots, rows,
               bind: dict[str, torch.Tensor], lower_bound: tuple | None = None) -> "_Event":
        """Bind new buffers, snapshot first-seen regions, write the inputs shard.
        ``lower_bound`` is ``(value,)`` for ops that take one."""
        undo = (set(self._seen_slots), set(self._seen_rows), set(self._seen_whole), dict(self._bound),
                self._lower_bound, self.stopped)
        tensors: dict[str, torch.Tensor] = {}
        for role, t in inputs.items():
            if t is not None:
                tensors[f"in.{role}"] = _cpu(t)
        self._max_batch = max(self._max_batch, inputs["state_indices"].shape[0])
        tensors.update(self._snapshots(slots, rows, bind, lower_bound))
        index = self.events
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        if self.max_bytes is not None and self.bytes + size > self.max_bytes:
            self.stopped = "max_bytes"
            return _Event(index, op, None, undo)
        meta = {"index": index, "op": op, "attrs": attrs, "context": self._context()}
        self.bytes += save_shard(self.shards / f"{index:06d}.in.safetensors", tensors, meta)
        self.events += 1
        if self.max_events is not None and self.events >= self.max_events:
            self.stopped = "max_events"
        return _Event(index, op, tensors, undo)

    def _call(self, event: "_Event", run):
        try:
            return run()
        except BaseException:
            if event.tensors is not None:  # the call raised: it is not an event of the trace
                (self.shards / f"{event.index:06d}.in.safetensors").unlink(missing_ok=True)
                self.events -= 1
                (self._seen_slots, self._seen_rows, self._seen_whole, self._bound, self._lower_bound,
                 self.stopped) = event.undo
                self.skipped["raised"] = self.skipped.get("raised", 0) + 1
            raise

    def _end(self, event: "_Event", expected: dict[str, torch.Tensor]) -> None:
        if event.tensors is None:
            return
        tensors = {f"expected.{role}": _cpu(t) for role, t in expected.items()}
        self.bytes += save_shard(self.shards / f"{event.index:06d}.out.safetensors", tensors, {"index": event.index})

    def _bind(self, name: str, tensor: torch.Tensor) -> None:
        self._bound.setdefault(name, tensor)

    def bind(self, checkpoint_state, records, pending, plan, A_log, dt_bias, lower_bound) -> None:
        """Declare the buffers of the trace before the first call (else each is bound when
        first seen), so that a trace of plans or defers alone still carries them all."""
        for role, t in {"checkpoint_state": checkpoint_state, **_records(records), "pending": pending,
                        **_plan(plan), **_params(A_log, dt_bias)}.items():
            self._bind(role, t)
        self._lower_bound = (lower_bound,)

    def _snapshots(self, slots, rows, bind: dict[str, torch.Tensor], lower_bound) -> dict[str, torch.Tensor]:
        """Bind the buffers of this call and copy the regions seen for the first time."""
        out: dict[str, torch.Tensor] = {}
        for role, t in bind.items():
            self._bind(role, t)
        for role in _WHOLE:
            if role in self._bound and role not in self._seen_whole:
                self._seen_whole.add(role)
                out[f"snap.{role}"] = _cpu(self._bound[role])
        if lower_bound is not None and self._lower_bound is None:
            self._lower_bound = lower_bound
        pool = self._bound.get("checkpoint_state")
        if pool is not None and slots is not None:
            new = self._first_sight(self._seen_slots, slots, NULL_ID + 1, pool.shape[0])
            if new:
                index = torch.tensor(new, dtype=torch.int64)
                out["snap.slots"] = index
                out["snap.states"] = _cpu(pool[index.to(pool.device)])
        corr = self._bound.get("records.correction")
        if corr is not None and rows is not None:
            new = self._first_sight(self._seen_rows, rows, 0, corr.shape[0])
            if new:
                index = torch.tensor(new, dtype=torch.int64)
                out["snap.rows"] = index
                out["snap.records.correction"] = _cpu(corr[index.to(corr.device)])
                kg = self._bound["records.key_gate"]
                out["snap.records.key_gate"] = _cpu(kg[index.to(kg.device)])
        return out

    def _first_sight(self, seen: set[int], indices, low: int, size: int) -> list[int]:
        """Indices in ``[low, size)`` this call touches (every one, with snapshot ``all``) that
        no earlier event did; they are marked seen."""
        wanted = range(size) if self.snapshot == "all" else _ints(indices, low, size)
        new = sorted(set(wanted) - seen)
        seen.update(new)
        return new

    def _context(self) -> dict[str, Any]:
        """What the manifest needs, as far as known now (each shard carries it)."""
        ctx: dict[str, Any] = {"provenance": {**self.provenance, "skipped_calls": dict(self.skipped)},
                               "max_batch": self._max_batch}
        pool, corr = self._bound.get("checkpoint_state"), self._bound.get("records.correction")
        if pool is not None and corr is not None:
            N, H, V, K = pool.shape
            ctx.update(dims={"H": H, "K": K, "V": V, "T": corr.shape[2]}, num_slots=N, num_record_rows=corr.shape[0],
                       state_dtype=dtype_name(pool.dtype),
                       activation_dtype=dtype_name(self._bound["records.key_gate"].dtype),
                       lower_bound=self._lower_bound[0] if self._lower_bound else None)
        if "pending" in self._bound:
            ctx["num_record_rows"] = self._bound["pending"].shape[0]
        if "plan.commit_lens" in self._bound:
            ctx["plan_rows"] = self._bound["plan.commit_lens"].shape[0]
        return ctx

    def close(self) -> MergeResult | None:
        """Stop recording and merge the shards into ``path`` (then remove them). Returns
        None when nothing was recorded. Raises ``RecordError`` (shards kept) when they
        cannot make a trace. Closing twice is a no-op."""
        if self.closed:
            return None
        self.closed = True
        if self.events == 0:
            shutil.rmtree(self.shards, ignore_errors=True)
            return None
        extra = {"skipped_calls": dict(self.skipped), "stopped_by": self.stopped, **self.closing_provenance()}
        result = merge_shards(self.shards, self.path, extra)
        shutil.rmtree(self.shards, ignore_errors=True)
        return result

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_WHOLE = ("pending", "A_log", "dt_bias", *(f"plan.{f}" for f in PLAN_FIELDS))
"""Bound buffers snapshot whole at first sight (small); pool and records go by region."""


@dataclass
class _Event:
    index: int
    op: str
    tensors: dict[str, torch.Tensor] | None  # None: not recorded (a cap was reached)
    undo: tuple  # what was seen and bound before it, restored when the call raises


def _records(records) -> dict[str, torch.Tensor]:
    return {"records.correction": records.correction, "records.key_gate": records.key_gate}


def _params(A_log, dt_bias) -> dict[str, torch.Tensor]:
    return {"A_log": A_log, "dt_bias": dt_bias}


def _plan(plan) -> dict[str, torch.Tensor]:
    return {f"plan.{f}": getattr(plan, f) for f in PLAN_FIELDS}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.dtype == b.dtype and a.device == b.device


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True).contiguous()


def _ints(t: torch.Tensor, lo: int, hi: int) -> list[int]:
    """Distinct values of ``t`` in ``[lo, hi)``."""
    v = t.reshape(-1).cpu().long()
    return sorted(set(v[(v >= lo) & (v < hi)].tolist()))


def _rows_or_default(record_indices, state_indices) -> torch.Tensor:
    if record_indices is not None:
        return record_indices
    return torch.arange(state_indices.shape[0], dtype=torch.int32)


def written_slots(plan, state_indices, record_rows) -> torch.Tensor:
    """Distinct slots a commit with this plan writes (docs/design.md §6), in row order (int64, CPU)."""
    B = state_indices.shape[0]
    n = plan.commit_lens[:B].cpu().long()
    slots, rows = state_indices.reshape(-1).cpu().long(), record_rows.reshape(-1).cpu().long()
    final, boundary = plan.final_state_indices[:B].cpu().long(), plan.boundary_state_indices[:B].cpu().long()
    recovery = plan.boundary_recovery_lens[:B].cpu().long()
    out: list[int] = []
    for b in range(B):
        if n[b] > 0 and slots[b] > NULL_ID and rows[b] >= 0:
            for s, ok in ((int(final[b]), True), (int(boundary[b]), 1 <= recovery[b] <= n[b])):
                if s > NULL_ID and ok and s not in out:
                    out.append(s)
    return torch.tensor(out, dtype=torch.int64)


def _states(pool: torch.Tensor, slots: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"slots": slots.to(torch.int32), "states": pool[slots.to(pool.device)]}


def record_play(tape, api, path: str | os.PathLike, device: str = "cpu", bufs=None) -> None:
    """Play ``tape`` (a ``traces.tape.Tape``) through ``api`` under a recorder writing ``path``,
    so that what ``api`` computes becomes the expected results. ``bufs``: the buffers to
    play on (default: fresh ``initial_buffers``); the recorder binds them up front."""
    from traces.tape import initial_buffers, play

    bufs = bufs or initial_buffers(tape, api, device)
    with Recorder(path, api) as rec:
        rec.bind(bufs.pool, bufs.records, bufs.pending, bufs.plan, bufs.A_log, bufs.dt_bias, tape.lower_bound)
        play(tape, rec, device, bufs=bufs)


# -- the process hook --------------------------------------------------------------------

@contextmanager
def record_trace(path: str | os.PathLike, impl: str | ModuleType = "kernels", **options: Any) -> Iterator[Recorder]:
    """``with record_trace(path) as api:`` record every call made through ``api``; the trace
    is merged on exit, also when the block raises (then a merge failure is not raised)."""
    recorder = Recorder(path, impl, **options)
    try:
        yield recorder
    except BaseException:
        try:
            recorder.close()
        except RecordError:
            pass
        raise
    recorder.close()


_process_recorder: Recorder | None = None


def api(impl: str = "kernels"):
    """The kernel API this process should call: ``impl`` itself, or, when ``KDA_RECORD``
    names a trace file, one recorder over it for the whole process, merged at exit."""
    global _process_recorder
    path = os.environ.get(ENV_PATH)
    if not path:
        from traces.impl import load_impl

        return load_impl(impl)
    if _process_recorder is None:
        _process_recorder = Recorder(path, os.environ.get("KDA_RECORD_IMPL", impl), **options_from_env())
        atexit.register(_close_at_exit, _process_recorder)
    return _process_recorder


def options_from_env() -> dict[str, Any]:
    """Recorder options from ``KDA_RECORD_OPS`` (comma-separated), ``KDA_RECORD_MAX_EVENTS``,
    ``KDA_RECORD_MAX_MB`` and ``KDA_RECORD_SNAPSHOT``; raises ``RecordError`` on a bad value."""
    env = os.environ
    options: dict[str, Any] = {}
    if env.get("KDA_RECORD_OPS"):
        options["ops"] = [op.strip() for op in env["KDA_RECORD_OPS"].split(",") if op.strip()]
    if env.get("KDA_RECORD_SNAPSHOT"):
        options["snapshot"] = env["KDA_RECORD_SNAPSHOT"]
    for var, key, scale in (("KDA_RECORD_MAX_EVENTS", "max_events", 1), ("KDA_RECORD_MAX_MB", "max_bytes", 2**20)):
        if env.get(var):
            try:
                options[key] = int(float(env[var]) * scale)
            except ValueError:
                raise RecordError(f"{var}={env[var]}: expected a number") from None
    return options


def _close_at_exit(recorder: Recorder) -> None:
    try:
        result = recorder.close()
    except RecordError as exc:
        print(f"kda record: {exc}", file=sys.stderr)
        return
    if result is not None:
        print(f"kda record: wrote {result.path} ({result.events} events)", file=sys.stderr)


__all__ = ["ENV_PATH", "MergeResult", "RecordError", "Recorder", "api", "merge_shards", "options_from_env",
           "record_play", "record_trace", "shards_dir", "written_slots"]
