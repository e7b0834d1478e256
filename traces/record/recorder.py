"""Recording the kernel calls of a live process into a trace.

``Recorder(path, impl)`` exposes the kernel API of ``impl`` (``kernels`` by default; any
spec ``traces.impl.loader.load_impl`` accepts, or a module object) and forwards every call to it.
Each recorded call becomes one event:

- before the call, its inputs and the first-seen contents of every buffer region it may
  touch (state slots, record rows; pending counts, plan and parameters whole; whole pools
  with ``snapshot="all"``) are written to ``<path>.shards/NNNNNN.in.safetensors``;
- after it returns, its results (the event's expected tensors, as ``kda replay``
  compares them) go to ``NNNNNN.out.safetensors``.

Shards are written atomically, so a process that dies leaves every completed event (and
the inputs of the call it died in) on disk; ``close()`` (or ``kda record merge``) merges
them into one trace: initial buffers assembled from the first-seen contents (zeros where
nothing was seen), events in order. A ``Recorder`` records one layer (format v1): the first
pool, records, pending counts, plan and parameters it sees are bound, and calls on other
buffers (another layer) are passed through unrecorded and counted; several layers are
recorded from patched modules (``traces.record.patch``, format v2).

Inside a CUDA graph capture (``traces.record.capture``) the recorder touches nothing on the
host: each call is forwarded as it is and counted in ``skipped_calls`` as ``captured``; with
the option ``graphs``, a verify is recorded at each replay of the graph instead
(``traces.record.graph_calls``).
``RecordedApi`` maps the kernel API onto the events of a ``traces.record.events.Recording``
(the bookkeeping of events: bound buffers, first-seen snapshots, shards, caps, merge);
``Recorder`` is that API over a recording of its own. A program that was not edited is
recorded by patching its modules (``traces.record.patch``), whose functions' calls go through
a ``RecordedApi`` too.

``record_trace(path, ...)`` is the context-manager form. ``api()`` is the hook a process
uses to get the kernel API: the plain implementation, or, when ``KDA_RECORD`` names a
trace file, a process-wide recorder closed at exit (options: ``KDA_RECORD_IMPL``,
``KDA_RECORD_OPS``, ``KDA_RECORD_MAX_EVENTS``, ``KDA_RECORD_MAX_MB``, ``KDA_RECORD_SNAPSHOT``,
``KDA_RECORD_GRAPHS``).
"""

from __future__ import annotations

import atexit
import os
import sys
from contextlib import contextmanager
from types import ModuleType
from typing import Any, Iterator, Mapping

import torch

from traces.format.schema import PLAN_FIELDS
from traces.ops.regions import written_slots
from traces.record.capture import capturing
from traces.record.events import Recording
from traces.record.options import check_options
from traces.record.shards import MergeResult, RecordError, merge_shards, shards_dir
from traces.ops.table import op_name

ENV_PATH = "KDA_RECORD"


class RecordingView:
    """What a recorder says of the trace it writes, read off its ``recording`` (a
    ``traces.record.events.Recording``): ``path``, ``shards``, ``events``, ``skipped``,
    ``stopped``, ``provenance``."""

    recording: Recording

    @property
    def path(self):
        return self.recording.path

    @property
    def shards(self):
        return self.recording.shards

    @property
    def events(self) -> int:
        return self.recording.events

    @property
    def skipped(self) -> dict[str, int]:
        return self.recording.skipped

    @property
    def stopped(self) -> str | None:
        return self.recording.stopped

    @property
    def provenance(self) -> dict[str, Any]:
        return self.recording.provenance


class RecordedApi:
    """The kernel API of ``impl``, each call recorded into ``recording`` (a
    ``traces.record.events.Recording``) and run through ``impl``'s own function: the event
    of a call whose buffers the recording accepts, else the call alone."""

    def __init__(self, recording: Recording, impl):
        self.recording, self.impl = recording, impl

    def kda_recoverssm_verify(self, q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, checkpoint_state,
                              records, query_start_loc, state_indices, spec_query_len, out=None, record_indices=None):
        def run():
            return self.impl.kda_recoverssm_verify(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound,
                                                   checkpoint_state, records, query_start_loc, state_indices,
                                                   spec_query_len, out=out, record_indices=record_indices)

        bind = {"checkpoint_state": checkpoint_state, **_records(records), **_params(A_log, dt_bias)}
        recording = self.recording
        inputs = {"q": q, "k": k, "v": v, "raw_g": raw_g, "raw_beta": raw_beta, "query_start_loc": query_start_loc,
                  "state_indices": state_indices}
        if capturing() and recording.graphs is not None:  # recorded at each replay of the graph
            if not recording.accepts(op_name.verify, bind, lower_bound, spec_query_len):
                return run()
            rows = _rows_or_default(record_indices, state_indices, state_indices.device)
            return recording.graphs.verify(run, inputs, rows, bind, {
                "layer": recording.layer, "lower_bound": lower_bound, "spec_query_len": spec_query_len,
                "default_rows": record_indices is None})
        if not self._wants(op_name.verify, bind, lower_bound, spec_query_len):
            return run()
        rows = _rows_or_default(record_indices, state_indices)
        event = recording.begin(op_name.verify, {**inputs, "record_indices": record_indices}, {}, state_indices, rows, bind,
                                (lower_bound,))
        result = recording.call(event, run)
        written = rows.long().clamp(min=0)
        recording.end(event, {"out": result, "records.correction": records.correction[written],
                              "records.key_gate": records.key_gate[written]})
        return result

    def kda_recoverssm_plan(self, plan, num_accepted, query_start_loc, state_indices, spec_query_len,
                            block_table=None, num_computed=None, block_size=None):
        def run():
            return self.impl.kda_recoverssm_plan(plan, num_accepted, query_start_loc, state_indices, spec_query_len,
                                                 block_table, num_computed, block_size)

        bind = _plan(plan)
        if not self._wants(op_name.plan, bind, None, spec_query_len, lower_bound_used=False):
            return run()
        attrs = {"block_size": int(block_size)} if block_table is not None else {}
        recording = self.recording
        event = recording.begin(op_name.plan, {"num_accepted": num_accepted, "query_start_loc": query_start_loc,
                                         "state_indices": state_indices, "block_table": block_table,
                                         "num_computed": num_computed}, attrs, None, None, bind)
        result = recording.call(event, run)
        B = state_indices.shape[0]
        recording.end(event, {f: getattr(plan, f)[:B] for f in PLAN_FIELDS})
        return result

    def kda_recoverssm_defer(self, plan, state_indices, record_rows, pending, eager=None):
        def run():
            return self.impl.kda_recoverssm_defer(plan, state_indices, record_rows, pending, eager)

        bind = {**_plan(plan), "pending": pending}
        if not self._wants(op_name.defer, bind, None, None, lower_bound_used=False):
            return run()
        recording = self.recording
        event = recording.begin(op_name.defer, {"state_indices": state_indices, "record_rows": record_rows,
                                          "eager": eager}, {}, None, None, bind)
        result = recording.call(event, run)
        recording.end(event, {"pending": pending, "commit_lens": plan.commit_lens[: state_indices.shape[0]]})
        return result

    def kda_recoverssm_commit(self, checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, plan,
                              record_indices=None):
        def run():
            return self.impl.kda_recoverssm_commit(checkpoint_state, records, A_log, dt_bias, lower_bound,
                                                   state_indices, plan, record_indices)

        bind = {"checkpoint_state": checkpoint_state, **_records(records), **_params(A_log, dt_bias), **_plan(plan)}
        if not self._wants(op_name.commit, bind, lower_bound, None):
            return run()
        rows = _rows_or_default(record_indices, state_indices)
        targets = written_slots(plan, state_indices, rows)
        touched = torch.cat([state_indices.reshape(-1).cpu().long(), targets])
        recording = self.recording
        event = recording.begin(op_name.commit, {"state_indices": state_indices, "record_indices": record_indices}, {},
                                touched, rows, bind, (lower_bound,))
        result = recording.call(event, run)
        recording.end(event, _states(checkpoint_state, targets))
        return result

    def kda_recoverssm_flush(self, checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, record_rows,
                             pending, plan, consume_pending=True):
        keep = {} if consume_pending else {"consume_pending": False}  # an implementation may not know the option

        def run():
            return self.impl.kda_recoverssm_flush(checkpoint_state, records, A_log, dt_bias, lower_bound,
                                                  state_indices, record_rows, pending, plan, **keep)

        bind = {"checkpoint_state": checkpoint_state, **_records(records), **_params(A_log, dt_bias),
                **_plan(plan), "pending": pending}
        if not self._wants(op_name.flush, bind, lower_bound, None):
            return run()
        recording = self.recording
        event = recording.begin(op_name.flush, {"state_indices": state_indices, "record_rows": record_rows},
                                {"consume_pending": bool(consume_pending)}, state_indices, record_rows, bind,
                                (lower_bound,))
        result = recording.call(event, run)
        recording.end(event, {**_states(checkpoint_state, written_slots(plan, state_indices, record_rows)),
                              "pending": pending})
        return result

    def kda_recoverssm_flush_verify(self, q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, checkpoint_state,
                                    records, query_start_loc, state_indices, spec_query_len, record_rows, pending,
                                    plan, out=None):
        """Recorded as what it stands for, a flush and then a verify of the same rows: two
        events, run as two calls so that the state between them is observed."""
        if capturing():  # the graph gets the fused call, as without the recorder
            self.recording.skip("captured")
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
            self.recording.skip("captured")
            return self.impl.kda_recoverssm_plan_deferred(plan, num_accepted, query_start_loc, state_indices,
                                                          spec_query_len, record_rows, pending, eager, block_table,
                                                          num_computed, block_size)
        rows = self.kda_recoverssm_plan(plan, num_accepted, query_start_loc, state_indices, spec_query_len,
                                        block_table, num_computed, block_size)
        self.kda_recoverssm_defer(plan, state_indices, record_rows, pending, eager)
        return rows

    def _wants(self, op: str, bind: dict[str, torch.Tensor], lower_bound, spec_query_len,
               lower_bound_used: bool = True) -> bool:
        """Whether to record this call: not inside a CUDA graph capture (``capturing``), and
        one the recording accepts (``Recording.accepts``)."""
        if capturing():
            self.recording.skip("captured")
            return False
        return self.recording.accepts(op, bind, lower_bound, spec_query_len, lower_bound_used)

    def bind(self, checkpoint_state, records, pending, plan, A_log, dt_bias, lower_bound) -> None:
        """Declare the buffers of the trace before the first call (else each is bound when
        first seen), so that a trace of plans or defers alone still carries them all."""
        for role, t in {"checkpoint_state": checkpoint_state, **_records(records), "pending": pending,
                        **_plan(plan), **_params(A_log, dt_bias)}.items():
            self.recording.bind(role, t)
        self.recording.lower_bound = (lower_bound,)


class Recorder(RecordedApi, RecordingView):
    """The kernel API of ``impl`` (``kernels`` by default, any spec ``traces.impl.loader.load_impl``
    accepts, or a module object), recording every call into a ``Recording`` of the trace
    ``path`` of its own (``recording``; ``options`` are its). Other attributes (buffer
    classes, ``NULL_BLOCK_ID``) come from ``impl``. Closing it (or leaving its ``with``
    block) merges the trace.
    """

    def __init__(self, path: str | os.PathLike, impl: str | ModuleType = "kernels", **options: Any):
        if isinstance(impl, str):
            from traces.impl.loader import ImplError, load_impl

            check_options(**options)  # refused before the implementation is imported
            try:
                module, name = load_impl(impl), impl
            except ImplError as exc:
                raise RecordError(str(exc)) from None
        else:
            module, name = impl, impl.__name__
        super().__init__(Recording(path, name, **options), module)

    def __getattr__(self, name: str) -> Any:
        if name == "impl":  # not set yet: never recurse
            raise AttributeError(name)
        return getattr(self.impl, name)

    def close(self) -> MergeResult | None:
        """Stop recording and merge the trace (``Recording.close``)."""
        return self.recording.close()

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _records(records) -> dict[str, torch.Tensor]:
    return {"records.correction": records.correction, "records.key_gate": records.key_gate}


def _params(A_log, dt_bias) -> dict[str, torch.Tensor]:
    return {"A_log": A_log, "dt_bias": dt_bias}


def _plan(plan) -> dict[str, torch.Tensor]:
    return {f"plan.{f}": getattr(plan, f) for f in PLAN_FIELDS}


def _rows_or_default(record_indices, state_indices, device: torch.device | str = "cpu") -> torch.Tensor:
    """The record rows of a call: ``record_indices``, else row b for batch row b (on ``device``)."""
    if record_indices is not None:
        return record_indices
    return torch.arange(state_indices.shape[0], dtype=torch.int32, device=device)


def _states(pool: torch.Tensor, slots: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"slots": slots.to(torch.int32), "states": pool[slots.to(pool.device)]}


def record_play(tape, api, path: str | os.PathLike, device: str = "cpu", bufs=None, snapshot: str = "touched") -> None:
    """Play ``tape`` (a ``traces.format.tape.Tape``) through ``api`` under a recorder writing ``path``,
    so that what ``api`` computes becomes the expected results. ``bufs``: the buffers to
    play on (default: fresh ``initial_buffers``); the recorder binds them up front.
    ``snapshot``: the recorder's (``all`` keeps the initial buffers whole)."""
    from traces.replay.buffers import initial_buffers
    from traces.replay.play import play

    bufs = bufs or initial_buffers(tape, api, device)
    with Recorder(path, api, snapshot=snapshot) as rec:
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
    path = os.environ.get(ENV_PATH)
    if not path:
        from traces.impl.loader import load_impl

        return load_impl(impl)
    if _process_recorder is None:
        set_process_recorder(Recorder(path, os.environ.get("KDA_RECORD_IMPL", impl), **options_from_env()))
    return _process_recorder


def set_process_recorder(recorder) -> None:
    """Make ``recorder`` (a ``Recorder``, or ``traces.record.patch.PatchRecorder`` in a patched
    child) the one recorder of this process: what ``api()`` returns, merged at exit."""
    global _process_recorder
    _process_recorder = recorder
    atexit.register(_close_at_exit, recorder)


def options_from_env(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Recorder options from ``KDA_RECORD_OPS`` (comma-separated), ``KDA_RECORD_MAX_EVENTS``,
    ``KDA_RECORD_MAX_MB``, ``KDA_RECORD_SNAPSHOT`` and ``KDA_RECORD_GRAPHS`` (``1`` or ``0``) of
    ``env`` (default: this process's environment); raises ``RecordError`` on a value that is
    not a number."""
    env = os.environ if env is None else env
    options: dict[str, Any] = {}
    if env.get("KDA_RECORD_OPS"):
        options["ops"] = [op.strip() for op in env["KDA_RECORD_OPS"].split(",") if op.strip()]
    if env.get("KDA_RECORD_SNAPSHOT"):
        options["snapshot"] = env["KDA_RECORD_SNAPSHOT"]
    if env.get("KDA_RECORD_GRAPHS"):
        if env["KDA_RECORD_GRAPHS"] not in ("0", "1"):
            raise RecordError(f"KDA_RECORD_GRAPHS={env['KDA_RECORD_GRAPHS']}: expected 1 or 0")
        options["graphs"] = env["KDA_RECORD_GRAPHS"] == "1"
    for var, key, scale in (("KDA_RECORD_MAX_EVENTS", "max_events", 1), ("KDA_RECORD_MAX_MB", "max_bytes", 2**20)):
        if env.get(var):
            try:
                options[key] = int(float(env[var]) * scale)
            except (ValueError, OverflowError):  # not a number, or infinite
                raise RecordError(f"{var}={env[var]}: expected a number") from None
    return options


def _close_at_exit(recorder) -> None:
    try:
        result = recorder.close()
    except RecordError as exc:
        print(f"kda record: {exc}", file=sys.stderr)
        return
    if result is not None:
        print(f"kda record: wrote {result.path} ({result.events} events)", file=sys.stderr)


__all__ = ["ENV_PATH", "MergeResult", "RecordError", "RecordedApi", "Recorder", "RecordingView", "api", "merge_shards",
           "options_from_env", "record_play", "record_trace", "set_process_recorder", "shards_dir", "written_slots"]
