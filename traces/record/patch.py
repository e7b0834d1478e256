"""Recording a program that was not edited: modules patched in place when they are imported.

``install(recorder, names)`` puts an import hook in front of ``sys.meta_path``; when a
module named in ``names`` is imported (or at once, if it already was), after it has run:

- each kernel API function it has (``FUNCTIONS``) is replaced by one that records the call
  through ``recorder`` and runs the module's own function;
- each documented raw kernel it has (``RAW_KERNELS``) is replaced by an object whose
  ``kernel[grid](...)`` launch runs the kernel and records it: ``_defer_commit_kernel`` as a
  defer event, ``_prepare_flush_plan_kernel`` as the start of a flush event that the next
  commit of that plan and those rows (the commit half of the flush) completes.

A call made while a recorded call runs (a module's verify calling its own helpers) is not
recorded again. A fused call (``FUSED_PARTS``) is recorded as its two parts, run through the
module's own; in a module without them, it ends the recording (``stopped_by``) and runs.

- its commit context class (``CONTEXT_CLASS``) has its ``create`` and ``commit`` replaced in
  place (``traces.record.commit_context``).

A model has one set of buffers per layer, told apart by the order in which their state pools
and pending counts were first used (a call on neither, by its plan's). The
``PatchRecorder``'s ``layer`` picks one, for a version 1 trace; its ``layers`` (``all`` or
model layer numbers) picks several, each a layer of a version 2 trace, with a commit
context's commit when the engine has one. Calls on other layers run unrecorded
(``skipped_calls["other_layer"]``) and the provenance says how many layers were seen.

In a child process, ``install_from_env`` does this from ``KDA_RECORD`` (the trace),
``KDA_RECORD_PATCH`` (comma-separated module names), ``KDA_RECORD_LAYER`` and
``KDA_RECORD_LAYERS``; ``kda record run --patch`` runs it at start-up through the
``sitecustomize`` in ``BOOT_DIR``.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import os
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import torch

from traces.ops.table import API
from traces.record.commit_context import CommitContextRecording
from traces.record.import_hook import PatchFinder
from traces.record.program_call import ProgramCall, kda_arguments
from traces.record.recorder import PLAN_FIELDS, Recorder, RecordError, capturing, written_slots

ENV_PATCH = "KDA_RECORD_PATCH"
ENV_LAYER = "KDA_RECORD_LAYER"
ENV_LAYERS = "KDA_RECORD_LAYERS"
BOOT_DIR = Path(__file__).with_name("boot")
"""Holds the ``sitecustomize`` that calls ``install_from_env`` in a child process."""

FUNCTIONS = (*API.values(), "kda_recoverssm_flush_verify", "kda_recoverssm_plan_deferred")
FUSED_PARTS = {"kda_recoverssm_flush_verify": ("kda_recoverssm_flush", "kda_recoverssm_verify"),
               "kda_recoverssm_plan_deferred": ("kda_recoverssm_plan", "kda_recoverssm_defer")}
"""A fused function -> the two calls it is recorded as, through the module's own."""
RAW_KERNELS = {
    "_defer_commit_kernel": ("state_indices_ptr", "commit_lens_ptr", "record_rows_ptr", "pending_ptr", "eager_ptr",
                             "null_block_id", "stride_state_indices"),
    "_prepare_flush_plan_kernel": ("state_indices_ptr", "record_rows_ptr", "pending_ptr", "commit_lens_ptr",
                                   "final_state_indices_ptr", "boundary_state_indices_ptr",
                                   "boundary_recovery_lens_ptr", "null_block_id", "stride_state_indices",
                                   "SPEC_QUERY_LEN"),
}
"""Documented raw kernels -> their documented parameters, in order."""

CONTEXT_CLASS = "KDARecoverSSMCommitContext"
"""A module's commit context class (``kernels.commit_context``'s surface): its ``create`` and
``commit`` are recorded (``traces.record.commit_context``)."""

_RECORDED = "__kda_recorded__"


def parse_layers(value: str) -> str | list[int]:
    """``--layers``: ``all``, or distinct model layer numbers ``0,7`` (returned sorted).
    Raises ``RecordError``."""
    if value.strip() == "all":
        return "all"
    parts = [part.strip() for part in value.split(",")]
    if not parts or not all(part.isdigit() for part in parts):
        raise RecordError(f"--layers {value}: expected all or layer numbers >= 0 such as 0,7")
    layers = sorted({int(part) for part in parts})
    if len(layers) != len(parts):
        raise RecordError(f"--layers {value}: a layer named twice")
    return layers


class PatchRecorder(CommitContextRecording, Recorder):
    """A ``Recorder`` fed by patched modules: each call runs through the calling module's own
    functions, only on the chosen layers' buffers.

    ``layer``: the one layer of a version 1 trace. ``layers`` (``"all"`` or model layer
    numbers; instead of ``layer``): a trace of those layers, each its own trace layer in
    model order, and of a commit context's ``create`` and ``commit``
    (``traces.record.commit_context``)."""

    def __init__(self, path, names: list[str], layer: int = 0, layers: str | None = None, **options: Any):
        if layer < 0:
            raise RecordError(f"layer must be >= 0, got {layer}")
        self.chosen = parse_layers(layers) if layers is not None else None
        super().__init__(path, SimpleNamespace(__name__="patched: " + ", ".join(names)), **options)
        self.layer = layer
        self.provenance.update(patched=list(names), **({"layer": layer} if layers is None else {"layers": layers}))
        self._layers: dict[str, list[tuple]] = {"checkpoint_state": [], "pending": [], "plan": []}
        self._depth = 0
        self._flush: dict[str, Any] | None = None  # a flush plan launched, its commit not yet seen
        self.init_context_recording()

    def closing_provenance(self) -> dict[str, Any]:
        return {"layers_seen": max(len(self._layers[kind]) for kind in ("checkpoint_state", "pending"))}

    # -- routing ----------------------------------------------------------------------

    def model_layer(self, kind: str, t: torch.Tensor) -> int:
        """The model layer whose ``kind`` buffer (``checkpoint_state``, ``pending``, ``plan``: its
        ``commit_lens`` column) ``t`` is: the order in which such buffers were first used."""
        seen, key = self._layers[kind], (t.data_ptr(), t.device)
        if key not in seen:
            seen.append(key)
        return seen.index(key)

    def trace_layer(self, model: int) -> int | None:
        """The trace layer of model layer ``model``, or None when it is not recorded."""
        if self.chosen is None:
            return 0 if model == self.layer else None
        if self.chosen == "all":
            return model
        return self.chosen.index(model) if model in self.chosen else None

    def route(self, checkpoint_state=None, pending=None, plan=None) -> bool:
        """Select the trace layer of a call on these buffers and say whether it is recorded.
        Its layer is that of its state pool and pending counts (both, when it passes both:
        they must agree); a call on neither is, in a version 1 trace, on the chosen layer once
        that layer's buffers are bound (or for layer 0), and in a trace of several layers on
        the layer of its plan (``plan``: its ``commit_lens`` column)."""
        models = {self.model_layer(kind, t) for kind, t in (("checkpoint_state", checkpoint_state),
                                                            ("pending", pending)) if t is not None}
        if not models and self.chosen is None:
            self.select_layer(0)
            return self.layer == 0 or any(role in self._bound for role in ("checkpoint_state", "pending"))
        if not models and plan is not None:
            models = {self.model_layer("plan", plan)}
        layer = self.trace_layer(models.pop()) if len(models) == 1 else None
        if layer is None:
            return False
        self.select_layer(layer)
        return True

    def call_function(self, name: str, originals: SimpleNamespace, args: tuple, kwargs: dict):
        """A patched function's call: recorded, and run exactly as the program made it (the
        module's own function, its own arguments); the parts of a fused call through
        ``originals``, the module's own functions."""
        call = ProgramCall(getattr(originals, name), args, kwargs)
        if self._depth:
            return call()
        if capturing():
            self.skip("captured")
            return call()
        bound = kda_arguments(_SIGNATURES[name], call)
        if isinstance(bound, str):
            self._stop(f"{name}: {bound}")
            return call()
        plan = bound.get("plan")
        if not self.route(bound.get("checkpoint_state"), bound.get("pending"),
                          None if plan is None else plan.commit_lens):
            self.skip("other_layer")
            return call()
        missing = [part for part in FUSED_PARTS.get(name, ()) if not callable(getattr(originals, part, None))]
        if missing:  # the state it changes unrecorded: the trace ends before it
            self.stopped = self.stopped or f"{name} without {' and '.join(missing)}"
            return call()
        if name != "kda_recoverssm_commit":
            self._drop_flush()
        self._depth += 1
        saved = self.impl
        self.impl = originals if name in FUSED_PARTS else SimpleNamespace(**{name: call})
        try:
            if name == "kda_recoverssm_commit" and self._flush is not None:
                return self.guarded(name, call, lambda: self._finish_flush(call, bound))
            return self.guarded(name, call, lambda: getattr(self, name)(**bound))
        finally:
            self.impl = saved
            self._depth -= 1

    def guarded(self, what: str, call: "ProgramCall", record):
        """``record()``: the recording of ``call``, which runs it once. Should the recording
        itself fail, it stops there (``stopped_by``, one line on stderr) and the program's call
        runs (or has run) once, as unrecorded; the call's own exceptions reach the program
        unchanged."""
        try:
            return record()
        except Exception as exc:
            if call.error is not None:
                raise
            if self.open_event is not None:  # an event half written is no event of the trace
                self._discard(self.open_event)
            self._stop(f"{what}: the recorder failed ({type(exc).__name__}: {exc}); the program runs on unrecorded")
            return call()

    def launch_kernel(self, name: str, launch, grid, args: tuple, kwargs: dict):
        """A patched raw kernel's ``kernel[grid](*args, **kwargs)``: run as launched, and recorded."""
        if self._depth:
            self.launched_inside(name)
            return launch(*args, **kwargs)
        if capturing():
            self.skip("captured")
            return launch(*args, **kwargs)
        call = ProgramCall(launch, args, kwargs)
        p = {**dict(zip(RAW_KERNELS[name], args)), **kwargs}
        if not isinstance(p.get("pending_ptr"), torch.Tensor):
            self._stop(f"{name} launched without its documented pending_ptr")
            return call()
        if not self.route(pending=p["pending_ptr"]):
            self.skip("other_layer")
            return call()
        if not (isinstance(grid, (tuple, list)) and len(grid) == 1):  # not one program a row: rows unknown
            self.stopped = self.stopped or f"{name} launched on a grid other than (rows,)"
            return call()
        unknown = [param for param in RAW_KERNELS[name] if param != "SPEC_QUERY_LEN" and param not in p]
        if unknown:
            self._stop(f"{name} launched without its documented {', '.join(unknown)}")
            return call()
        self._drop_flush()
        self._depth += 1
        try:
            return self.guarded(name, call, lambda: self._record_launch(name, call, int(grid[0]), p))
        finally:
            self._depth -= 1

    def _record_launch(self, name: str, call: "ProgramCall", B: int, p: dict):
        state_indices = torch.as_strided(p["state_indices_ptr"], (B,), (int(p["stride_state_indices"]),),
                                         p["state_indices_ptr"].storage_offset())
        if name == "_defer_commit_kernel":
            return self._record_defer(call, B, state_indices, p)
        return self._start_flush(call, B, state_indices, p)

    def _drop_flush(self) -> None:
        """A flush plan whose commit never came: not an event (counted)."""
        if self._flush is not None:
            self._flush = None
            self.skip("flush_plan_without_commit")

    # -- the raw kernels' events --------------------------------------------------------

    def _plan_column(self, field: str, t: torch.Tensor) -> torch.Tensor:
        """The bound plan column that ``t`` starts (an engine may pass its first B rows)."""
        bound = self._bound.get(f"plan.{field}")
        if bound is not None and bound.data_ptr() == t.data_ptr() and bound.numel() >= t.numel():
            return bound
        return t

    def _record_defer(self, call, B, state_indices, p):
        commit_lens, pending, eager = self._plan_column("commit_lens", p["commit_lens_ptr"]), p["pending_ptr"], \
            p["eager_ptr"]
        bind = {"plan.commit_lens": commit_lens, "pending": pending}
        if not self._wants("defer", bind, None, None, lower_bound_used=False):
            return call()
        inputs = {"state_indices": state_indices, "record_rows": p["record_rows_ptr"][:B],
                  "eager": None if eager is None else eager[:B]}
        event = self._begin("defer", inputs, {}, None, None, bind)
        result = self._call(event, call)
        self._end(event, {"pending": pending, "commit_lens": commit_lens[:B]})
        return result

    def _start_flush(self, call, B, state_indices, p):
        """Run the flush plan; the event is written when its commit comes (``_finish_flush``),
        with ``pending`` as it was before this launch."""
        plan = {f: self._plan_column(f, p[f"{f}_ptr"]) for f in PLAN_FIELDS}
        bind = {**{f"plan.{f}": t for f, t in plan.items()}, "pending": p["pending_ptr"]}
        if not self._wants("flush", bind, None, None, lower_bound_used=False):
            return call()
        before = {"pending": p["pending_ptr"].clone(), **{f"plan.{f}": t.clone() for f, t in plan.items()}}
        result = call()
        self._flush = {"state_indices": state_indices, "record_rows": p["record_rows_ptr"][:B], "plan": plan,
                       "pending": p["pending_ptr"], "before": before}
        return result

    def _finish_flush(self, run, a: dict[str, Any]):
        """The commit after a flush plan (``run``: the program's commit call, ``a`` its
        arguments by kda's names): one flush event over both, when it commits that plan for
        those rows; else the flush plan is dropped (counted) and the commit recorded."""
        flush, self._flush = self._flush, None
        plan = a["plan"]
        rows = a.get("record_indices")
        same = (rows is not None and plan.commit_lens.data_ptr() == flush["plan"]["commit_lens"].data_ptr()
                and torch.equal(rows[: flush["record_rows"].shape[0]].cpu(), flush["record_rows"].cpu())
                and torch.equal(a["state_indices"].cpu(), flush["state_indices"].cpu()))
        if not same:
            self.skip("flush_plan_without_commit")
            return self.kda_recoverssm_commit(**a)
        pool, records, pending = a["checkpoint_state"], a["records"], flush["pending"]
        bind = {"checkpoint_state": pool, "records.correction": records.correction,
                "records.key_gate": records.key_gate, "A_log": a["A_log"], "dt_bias": a["dt_bias"],
                **{f"plan.{f}": t for f, t in flush["plan"].items()}, "pending": pending}
        if not self._wants("flush", bind, a["lower_bound"], None):
            return run()
        # the event begins where the flush plan launch did: its snapshots and writes see the
        # counts and plan columns from before it (a kernel that consumes counts shows as one)
        after = {role: bind[role].clone() for role in flush["before"]}
        for role, t in flush["before"].items():
            bind[role].copy_(t)
        try:
            event = self._begin("flush", {"state_indices": flush["state_indices"],
                                          "record_rows": flush["record_rows"]}, {"consume_pending": False},
                                flush["state_indices"], flush["record_rows"], bind, (a["lower_bound"],))
        finally:
            for role, t in after.items():
                bind[role].copy_(t)
        result = self._call(event, run)
        slots = written_slots(plan, flush["state_indices"], flush["record_rows"])
        self._end(event, {"slots": slots.to(torch.int32), "states": pool[slots.to(pool.device)],
                          "pending": pending})
        return result


_SIGNATURES = {name: inspect.signature(getattr(Recorder, name)) for name in FUNCTIONS}


class RecordedKernel:
    """A raw kernel whose ``kernel[grid](...)`` launches are recorded; anything else is the
    kernel's own."""

    def __init__(self, kernel, name: str, recorder: PatchRecorder):
        self.kernel, self.name, self.recorder = kernel, name, recorder
        setattr(self, _RECORDED, True)

    def __getitem__(self, grid):
        launch = self.kernel[grid]
        return lambda *args, **kwargs: self.recorder.launch_kernel(self.name, launch, grid, args, kwargs)

    def __getattr__(self, name: str):
        return getattr(self.kernel, name)


def patch_module(module: ModuleType, recorder: PatchRecorder) -> list[str]:
    """Replace ``module``'s API functions and raw kernels in place; return the names replaced.
    Names that are already recorded (imported from another patched module) are left alone."""
    originals = SimpleNamespace(**{n: getattr(module, n) for n in FUNCTIONS if callable(getattr(module, n, None))})
    replaced = []
    for name, original in vars(originals).items():
        if getattr(original, _RECORDED, False):
            continue

        def recorded(*args, _name=name, **kwargs):
            return recorder.call_function(_name, originals, args, kwargs)

        functools.update_wrapper(recorded, original)
        setattr(recorded, _RECORDED, True)
        setattr(module, name, recorded)
        replaced.append(name)
    for name in RAW_KERNELS:
        kernel = getattr(module, name, None)
        if kernel is not None and not getattr(kernel, _RECORDED, False):
            setattr(module, name, RecordedKernel(kernel, name, recorder))
            replaced.append(name)
    context = getattr(module, CONTEXT_CLASS, None)
    if isinstance(context, type):
        replaced += patch_context_class(context, recorder)
    return replaced


def patch_context_class(cls: type, recorder: PatchRecorder) -> list[str]:
    """Set on commit context class ``cls`` a recorded ``create`` and ``commit`` that run the
    ones it has (its own or inherited, unless already recorded); return the names replaced."""
    replaced = []
    create = inspect.getattr_static(cls, "create", None)
    if isinstance(create, classmethod) and not getattr(create.__func__, _RECORDED, False):
        def recorded_create(klass, *args, _create=create.__func__, **kwargs):
            return recorder.create_context(_create, klass, args, kwargs)

        functools.update_wrapper(recorded_create, create.__func__)
        setattr(recorded_create, _RECORDED, True)
        cls.create = classmethod(recorded_create)
        replaced.append(f"{CONTEXT_CLASS}.create")
    commit = inspect.getattr_static(cls, "commit", None)
    if callable(commit) and not getattr(commit, _RECORDED, False):
        def recorded_commit(context, *args, _commit=commit, **kwargs):
            return recorder.commit_context(_commit, context, args, kwargs)

        functools.update_wrapper(recorded_commit, commit)
        setattr(recorded_commit, _RECORDED, True)
        cls.commit = recorded_commit
        replaced.append(f"{CONTEXT_CLASS}.commit")
    return replaced


def install(recorder: PatchRecorder, names: list[str]) -> PatchFinder:
    """Patch ``names`` now where imported, and on import from now on."""
    finder = PatchFinder(names, functools.partial(patch_module, recorder=recorder))
    sys.meta_path.insert(0, finder)
    for name in names:
        if name in sys.modules:
            patch_module(sys.modules[name], recorder)
    return finder


def parse_names(value: str) -> list[str]:
    return [name.strip() for name in value.split(",") if name.strip()]


def install_from_env() -> PatchRecorder | None:
    """In a process started with ``KDA_RECORD`` and ``KDA_RECORD_PATCH`` set: one recorder for
    the process (also what ``traces.record.recorder.api()`` returns), merged at exit."""
    import traces.record.recorder as record

    path, names = os.environ.get(record.ENV_PATH), parse_names(os.environ.get(ENV_PATCH, ""))
    if not path or not names:
        return None
    try:
        layer = int(os.environ.get(ENV_LAYER, "0"))
    except ValueError:
        raise RecordError(f"{ENV_LAYER}={os.environ[ENV_LAYER]}: expected an integer") from None
    recorder = PatchRecorder(path, names, layer, os.environ.get(ENV_LAYERS) or None, **record.options_from_env())
    record._process_recorder = recorder
    atexit.register(record._close_at_exit, recorder)
    install(recorder, names)
    return recorder


__all__ = ["BOOT_DIR", "CONTEXT_CLASS", "ENV_LAYER", "ENV_LAYERS", "ENV_PATCH", "FUNCTIONS", "RAW_KERNELS",
           "PatchFinder", "PatchRecorder", "RecordedKernel", "install", "install_from_env", "parse_layers", "parse_names",
           "patch_context_class", "patch_module"]
