"""Recording a program that was not edited: modules patched in place when they are imported.

``install(recorder, names)`` puts an import hook (``traces.record.import_hook``) in front of
``sys.meta_path``; when a module named in ``names`` is imported (or at once, if it already
was), after it has run:

- each kernel API function it has (``FUNCTIONS``) is replaced by one that records the call
  through ``recorder`` and runs the module's own function;
- each documented raw kernel it has (``traces.record.launches.RAW_KERNELS``) is replaced by an
  object whose ``kernel[grid](...)`` launch runs the kernel and records it: ``_defer_commit_kernel``
  as a defer event, ``_prepare_flush_plan_kernel`` as the start of a flush event that the next
  commit of that plan and those rows (the commit half of the flush) completes;
- its commit context class (``CONTEXT_CLASS``) has its ``create`` and ``commit`` replaced in
  place (``traces.record.commit_context``).

A call made while a recorded call runs (a module's verify calling its own helpers) is not
recorded again. A fused call (``FUSED_PARTS``) is recorded as its two parts, run through the
module's own; in a module without them, it ends the recording (``stopped_by``) and runs.

A ``PatchRecorder`` is made of parts that share one ``traces.record.events.Recording`` (the
trace, its events and bound buffers) and call it only: a ``traces.record.routing.LayerRouter``
(which model layer a call is on, which are recorded: ``layer`` for a version 1 trace,
``layers``, ``all`` or model layer numbers, for a version 2 trace, with a commit context's
commit when the engine has one), a ``traces.record.recorder.RecordedApi`` per patched
function's call, a ``traces.record.launches.FlushPairing`` and a
``traces.record.commit_context.ContextRecording``. Calls on other layers run unrecorded
(``skipped_calls["other_layer"]``) and the provenance says how many layers were seen.

In a child process, ``install_from_env`` does this from ``KDA_RECORD`` (the trace),
``KDA_RECORD_PATCH`` (comma-separated module names), ``KDA_RECORD_LAYER`` and
``KDA_RECORD_LAYERS``; ``kda record run --patch`` runs it at start-up through the
``sitecustomize`` in ``BOOT_DIR``.
"""

from __future__ import annotations

import functools
import inspect
import os
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import torch

from traces.record.capture import capturing
from traces.record.commit_context import ContextRecording
from traces.record.events import Recording
from traces.record.import_hook import PatchFinder, hook_imports
from traces.record.launches import RAW_KERNELS, FlushPairing, record_defer
from traces.record.program_call import Nesting, ProgramCall, guarded, kda_arguments
from traces.record.recorder import RecordedApi, RecordingView
from traces.record.routing import LayerRouter, parse_layers
from traces.record.shards import MergeResult, RecordError
from traces.ops.table import API

ENV_PATCH = "KDA_RECORD_PATCH"
ENV_LAYER = "KDA_RECORD_LAYER"
ENV_LAYERS = "KDA_RECORD_LAYERS"
BOOT_DIR = Path(__file__).with_name("boot")
"""Holds the ``sitecustomize`` that calls ``install_from_env`` in a child process."""

FUNCTIONS = (*API.values(), "kda_recoverssm_flush_verify", "kda_recoverssm_plan_deferred")
FUSED_PARTS = {"kda_recoverssm_flush_verify": ("kda_recoverssm_flush", "kda_recoverssm_verify"),
               "kda_recoverssm_plan_deferred": ("kda_recoverssm_plan", "kda_recoverssm_defer")}
"""A fused function -> the two calls it is recorded as, through the module's own."""
CONTEXT_CLASS = "KDARecoverSSMCommitContext"
"""A module's commit context class (``kernels.context.engine``'s surface): its ``create`` and
``commit`` are recorded (``traces.record.commit_context``)."""

_RECORDED = "__kda_recorded__"


class PatchRecorder(RecordingView):
    """Records the calls of patched modules into the trace ``path`` (module docstring): each
    call runs through the calling module's own functions, only on the chosen layers' buffers.

    ``layer``: the one layer of a version 1 trace. ``layers`` (``"all"`` or model layer
    numbers; instead of ``layer``): a trace of those layers, each its own trace layer in
    model order, and of a commit context's ``create`` and ``commit``
    (``traces.record.commit_context``). ``options``: the ``Recording``'s."""

    def __init__(self, path, names: list[str], layer: int = 0, layers: str | None = None, **options: Any):
        if layer < 0:
            raise RecordError(f"layer must be >= 0, got {layer}")
        chosen = parse_layers(layers) if layers is not None else None
        self.recording = Recording(path, "patched: " + ", ".join(names), **options)
        self.recording.provenance.update(patched=list(names),
                                         **({"layer": layer} if layers is None else {"layers": layers}))
        self.router = LayerRouter(self.recording, layer, chosen)
        self.nesting = Nesting()
        self.flushes = FlushPairing(self.recording)
        self.contexts = ContextRecording(self.recording, self.router, self.nesting, self.flushes)

    def close(self) -> MergeResult | None:
        """Stop recording and merge the trace (``Recording.close``), its provenance saying
        how many layers the program used (``layers_seen``)."""
        return self.recording.close({"layers_seen": self.router.layers_seen()})

    def __enter__(self) -> "PatchRecorder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def call_function(self, name: str, originals: SimpleNamespace, args: tuple, kwargs: dict):
        """A patched function's call: recorded, and run exactly as the program made it (the
        module's own function, its own arguments); the parts of a fused call through
        ``originals``, the module's own functions."""
        recording = self.recording
        call = ProgramCall(getattr(originals, name), args, kwargs)
        if self.nesting:
            return call()
        if capturing() and not (name == "kda_recoverssm_verify" and recording.graphs is not None):
            recording.skip("captured")
            return call()
        bound = kda_arguments(_SIGNATURES[name], call)
        if isinstance(bound, str):
            recording.stop(f"{name}: {bound}")
            return call()
        plan = bound.get("plan")
        if not self.router.route(bound.get("checkpoint_state"), bound.get("pending"),
                                 None if plan is None else plan.commit_lens):
            recording.skip("other_layer")
            return call()
        missing = [part for part in FUSED_PARTS.get(name, ()) if not callable(getattr(originals, part, None))]
        if missing:  # the state it changes unrecorded: the trace ends before it
            recording.stop(f"{name} without {' and '.join(missing)}", quiet=True)
            return call()
        if name != "kda_recoverssm_commit":
            self.flushes.drop()
        api = RecordedApi(recording, originals if name in FUSED_PARTS else SimpleNamespace(**{name: call}))
        with self.nesting:
            if name == "kda_recoverssm_commit" and self.flushes.waiting:
                return guarded(recording, name, call, lambda: self.flushes.finish(call, bound,
                                                                                  api.kda_recoverssm_commit))
            return guarded(recording, name, call, lambda: getattr(api, name)(**bound))

    def launch_kernel(self, name: str, launch, grid, args: tuple, kwargs: dict):
        """A patched raw kernel's ``kernel[grid](*args, **kwargs)``: run as launched, and recorded."""
        recording = self.recording
        if self.nesting:
            self.contexts.launched_inside(name)
            return launch(*args, **kwargs)
        if capturing():
            recording.skip("captured")
            return launch(*args, **kwargs)
        call = ProgramCall(launch, args, kwargs)
        p = {**dict(zip(RAW_KERNELS[name], args)), **kwargs}
        if not isinstance(p.get("pending_ptr"), torch.Tensor):
            recording.stop(f"{name} launched without its documented pending_ptr")
            return call()
        if not self.router.route(pending=p["pending_ptr"]):
            recording.skip("other_layer")
            return call()
        if not (isinstance(grid, (tuple, list)) and len(grid) == 1):  # not one program a row: rows unknown
            recording.stop(f"{name} launched on a grid other than (rows,)", quiet=True)
            return call()
        unknown = [param for param in RAW_KERNELS[name] if param != "SPEC_QUERY_LEN" and param not in p]
        if unknown:
            recording.stop(f"{name} launched without its documented {', '.join(unknown)}")
            return call()
        self.flushes.drop()
        with self.nesting:
            return guarded(recording, name, call, lambda: self._record_launch(name, call, int(grid[0]), p))

    def _record_launch(self, name: str, call: ProgramCall, B: int, p: dict):
        state_indices = torch.as_strided(p["state_indices_ptr"], (B,), (int(p["stride_state_indices"]),),
                                         p["state_indices_ptr"].storage_offset())
        if name == "_defer_commit_kernel":
            return record_defer(self.recording, call, B, state_indices, p)
        return self.flushes.start(call, B, state_indices, p)


_SIGNATURES = {name: inspect.signature(getattr(RecordedApi, name)) for name in FUNCTIONS}


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
            return recorder.contexts.create(_create, klass, args, kwargs)

        functools.update_wrapper(recorded_create, create.__func__)
        setattr(recorded_create, _RECORDED, True)
        cls.create = classmethod(recorded_create)
        replaced.append(f"{CONTEXT_CLASS}.create")
    commit = inspect.getattr_static(cls, "commit", None)
    if callable(commit) and not getattr(commit, _RECORDED, False):
        def recorded_commit(context, *args, _commit=commit, **kwargs):
            return recorder.contexts.commit(_commit, context, args, kwargs)

        functools.update_wrapper(recorded_commit, commit)
        setattr(recorded_commit, _RECORDED, True)
        cls.commit = recorded_commit
        replaced.append(f"{CONTEXT_CLASS}.commit")
    return replaced


def install(recorder: PatchRecorder, names: list[str]) -> PatchFinder:
    """Patch ``names`` for ``recorder`` now where imported, and on import from now on."""
    return hook_imports(names, functools.partial(patch_module, recorder=recorder))


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
    record.set_process_recorder(recorder)
    install(recorder, names)
    return recorder


__all__ = ["BOOT_DIR", "CONTEXT_CLASS", "ENV_LAYER", "ENV_LAYERS", "ENV_PATCH", "FUNCTIONS", "FUSED_PARTS",
           "PatchRecorder", "RecordedKernel", "install", "install_from_env", "parse_names", "patch_context_class",
           "patch_module"]
