"""Recording an engine's commit context: its ``create`` binds every layer, its ``commit`` is one
``commit_layers`` event (docs/recording.md, docs/trace-format.md).

A module's ``KDARecoverSSMCommitContext`` (kda's ``kernels.context.engine`` surface) is
patched in place (``traces.record.patch``), its ``create`` and ``commit`` calls recorded by
``ContextRecording``. ``create(layers, spec_query_len, max_num_reqs,
conv_dim_first=...)`` tells the recorder the model's layers: layer ``i`` of the context is
trace layer ``i``, its ``kv_cache = (conv_state, checkpoint_state, correction, key_gate)``,
``A_log`` and ``dt_bias`` are bound to it, its conv state layout comes from
``conv_dim_first`` (or, when ``create`` has no such argument, from the shapes: ``[N, dim, S]``
unless the last axis is the longer), and the context's plan buffer (``context.plan``) is the
trace's shared plan. ``commit(...)`` becomes a ``commit_layers`` event spanning every layer,
its expected results the slots it wrote, every layer's states there and every layer's first
``W - 1`` conv entries there.

The released engine's context (vLLM 0.33.0, ``traces.impl.release.is_release_context``) is
recorded the same way: its layers' ``kv_cache = (conv_state, checkpoint_state)`` and
``recoverssm_records``, the conv layout from its module's ``is_conv_state_dim_first()``, its
plan its own four columns, and each commit an event of records by batch row under the
release's align-mode rule (attrs ``records`` and ``rule``). ``backend="cute"`` (SM10x) is
said on stderr and in the provenance: the CuTe verify runs outside the patched module.

Arguments are read by kda's names (``create``'s ``layers``, ``spec_query_len`` and
``conv_dim_first``; ``commit``'s ``COMMIT_ARGS`` and the optional four). What the recorder
cannot read that way, and what a trace of format v2 cannot hold, ends the recording
(``stopped_by``, and one line on stderr) before it, never a wrong trace, and the call runs
as it would unrecorded: a context of several layers when the recording chose some only, a
context's layer used under another number before ``create``, layers of differing shapes, a
conv state in another dtype than the activations, a context without a plan (a ``plan`` buffer,
or the four plan columns of its own), and a raw kernel (a defer, a flush plan) launched
inside the commit.
"""

from __future__ import annotations

import inspect
import sys
from types import SimpleNamespace
from typing import Any

import torch

from traces.format.schema import PLAN_FIELDS
from traces.impl.release import RECORDS, RULE, is_release_context
from traces.record.capture import capturing
from traces.record.events import Recording, same_tensor
from traces.record.launches import FlushPairing
from traces.record.program_call import Nesting, ProgramCall, guarded
from traces.record.recorder import written_slots
from traces.record.routing import LayerRouter
from traces.ops.table import op_name

CUTE_NOTE = ("verify: the release's CuTe backend (SM10x, bf16 state) verifies through CuteRecoverSSMVerify, outside "
             "the patched module, so no verify is recorded (its records are writes) and only the commits are checked; "
             "serve with a float32 SSM state (vLLM's --mamba-ssm-cache-dtype float32) to run and record the Triton "
             "backend")
"""What a recording of the release's context under ``backend="cute"`` does not hold, and why."""

COMMIT_ARGS = ("num_accepted_tokens", "state_indices", "query_start_loc")
"""What a recorded ``commit`` takes by these names (kda's), besides ``request_indices``,
``block_table``, ``num_computed_tokens`` and ``mamba_block_size``."""


class ContextRecording:
    """What a recording does with a commit context (module docstring): ``create`` and ``commit``
    are the patched class's, called with the program's arguments. It records into
    ``recording`` on the layers ``router`` routes, leaves alone what the program calls while
    ``nesting`` says one of its calls is recorded, and drops a flush plan still waiting in
    ``flushes`` (``traces.record.launches.FlushPairing``) when a commit comes."""

    def __init__(self, recording: Recording, router: LayerRouter, nesting: Nesting, flushes: FlushPairing):
        self.recording, self.router, self.nesting, self.flushes = recording, router, nesting, flushes
        self._contexts: dict[int, tuple] = {}  # bound context id -> (its plan, the columns it mirrors, event attrs)
        self._in_commit: str | None = None  # the context commit running, while it runs
        self._unrepresentable: str | None = None

    def launched_inside(self, name: str) -> None:
        """A raw kernel launched inside a recorded call: inside a context's commit the event
        cannot say what it did (ends the recording once that commit returns)."""
        if self._in_commit is not None and self._unrepresentable is None:
            self._unrepresentable = (f"{name} launched inside {self._in_commit}: the commit_layers event of trace "
                                     "format v2 holds no defer or flush plan")

    # -- create -----------------------------------------------------------------------

    def create(self, create, klass, args: tuple, kwargs: dict):
        """``klass.create(*args, **kwargs)`` through ``create`` (the class's own function),
        its layers bound to the trace."""
        context = create(klass, *args, **kwargs)
        if self.nesting:
            return context
        recording = self.recording
        if self.router.chosen is None or recording.closed or recording.stopped:
            recording.skip("commit_context")
            return context
        try:
            self._read_context(create, klass, context, args, kwargs)
        except Exception as exc:  # the recorder's own failure: the program goes on with its context
            recording.stop(f"{klass.__name__}.create: the recorder failed ({type(exc).__name__}: {exc})")
        return context

    def _read_context(self, create, klass, context, args: tuple, kwargs: dict) -> None:
        """Bind a created context's layers to the trace, or stop the recording."""
        try:
            a = _arguments(create, klass, args, kwargs)
            models = [_layer_fields(layer) for layer in a["layers"]]
            spec_query_len = int(a["spec_query_len"])
            conv_dim_first = a.get("conv_dim_first")
            if conv_dim_first is None and callable(create.__globals__.get("is_conv_state_dim_first")):
                conv_dim_first = bool(create.__globals__["is_conv_state_dim_first"]())
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            self.recording.stop(f"{klass.__name__}.create: its layers cannot be read as kda's "
                                f"({type(exc).__name__}: {exc})")
            return
        release = is_release_context(klass)
        if a.get("backend") == "cute":
            self.recording.provenance.setdefault("not_recorded", []).append(CUTE_NOTE)
            print(f"kda record: {CUTE_NOTE}", file=sys.stderr)
        attrs = {"records": RECORDS, "rule": RULE} if release else {}
        self._bind_context(context, models, spec_query_len, conv_dim_first, attrs)

    def _bind_context(self, context, models: list[tuple], spec_query_len: int, conv_dim_first: bool | None,
                      attrs: dict[str, str]) -> None:
        """Bind the context's layers (``_layer_fields`` of each) to trace layers 0.., or stop;
        ``attrs``: those of its ``commit_layers`` events."""
        recording, router = self.recording, self.router
        if router.chosen != "all" and len(models) > 1:
            recording.stop(f"a commit context holds {len(models)} layers and --layers "
                           f"{','.join(map(str, router.chosen))} chose some: record it with --layers all")
            return
        plan, mirrored = context_plan(context)
        if plan is None:
            recording.stop(f"{type(context).__name__} has no plan (context.plan, or columns of its own, "
                           f"{', '.join(PLAN_FIELDS)})")
            return
        for i, (kv_cache, A_log, dt_bias, lower_bound) in enumerate(models):
            conv, pool = kv_cache[0], kv_cache[1]
            if router.model_layer("checkpoint_state", pool) != i:
                recording.stop(f"layer {i} of the commit context was used as layer "
                               f"{router.model_layer('checkpoint_state', pool)} before it was created")
                return
            dim_first = conv_dim_first if conv_dim_first is not None else conv.shape[1] >= conv.shape[2]
            entries = conv.shape[2] if dim_first else conv.shape[1]
            if conv.dtype != kv_cache[3].dtype:
                recording.stop(f"layer {i}'s conv state is {conv.dtype}, its activations {kv_cache[3].dtype}: a "
                               "trace keeps conv state in the activation dtype")
                return
            if router.trace_layer(i) is None:
                recording.stop(f"the commit context's layer {i} is not among --layers "
                               f"{','.join(map(str, router.chosen))}")
                return
            recording.select_layer(router.trace_layer(i))
            bind = {"checkpoint_state": pool, "records.correction": kv_cache[2], "records.key_gate": kv_cache[3],
                    "A_log": A_log, "dt_bias": dt_bias, "conv_state": conv,
                    **{f"plan.{f}": getattr(plan, f) for f in PLAN_FIELDS}}
            bound = recording.bound
            unlike = [role for role, t in bind.items() if role in bound and not same_tensor(bound[role], t)]
            if unlike or recording.lower_bound not in (None, (lower_bound,)):
                recording.stop(f"layer {i} of the commit context is not the layer {i} recorded before it was "
                               f"created ({', '.join(unlike) or 'gate_lower_bound'} differs)")
                return
            differs = recording.unlike_other_layers(bind)
            if differs is not None:
                recording.stop(differs)
                return
            for role, t in bind.items():
                recording.bind(role, t)
            recording.bind_conv(conv, "dim_first" if dim_first else "token_first", entries - spec_query_len + 2)
            if recording.lower_bound is None:
                recording.lower_bound = (lower_bound,)
        self._contexts[id(context)] = (plan, mirrored, attrs)

    # -- commit -----------------------------------------------------------------------

    def commit(self, commit, context, args: tuple, kwargs: dict):
        """``context.commit(*args, **kwargs)`` through ``commit`` (the class's own function):
        one ``commit_layers`` event when the context is bound to the trace."""
        recording = self.recording
        if self.nesting:
            return commit(context, *args, **kwargs)
        if capturing():
            recording.skip("captured")
            return commit(context, *args, **kwargs)
        if (id(context) not in self._contexts or recording.closed or recording.stopped
                or op_name.commit not in recording.ops):
            recording.skip("commit_context")
            return commit(context, *args, **kwargs)
        try:
            a = _arguments(commit, context, args, kwargs)
        except TypeError as exc:  # the call itself will say how it does not bind
            recording.stop(f"{type(context).__name__}.commit: {exc}")
            return commit(context, *args, **kwargs)
        need = COMMIT_ARGS + (("mamba_block_size",) if a.get("block_table") is not None else ())
        missing = [name for name in need if not isinstance(a.get(name), torch.Tensor | int)]
        if missing:
            recording.stop(f"{type(context).__name__}.commit: no {', '.join(missing)} among its arguments "
                           "(kda's names)")
            return commit(context, *args, **kwargs)
        B = a["state_indices"].shape[0]
        if B == 0:
            return commit(context, *args, **kwargs)
        self.flushes.drop()
        call = ProgramCall(commit, (context, *args), kwargs)
        with self.nesting:
            return guarded(recording, f"{type(context).__name__}.commit", call,
                           lambda: self._record_commit(call, context, a, B))

    def _record_commit(self, call: ProgramCall, context, a: dict, B: int):
        recording = self.recording
        state_indices, block_table = a["state_indices"], a.get("block_table")
        requests = a.get("request_indices")
        plan, mirrored, context_attrs = self._contexts[id(context)]
        inputs = {"num_accepted": a["num_accepted_tokens"], "state_indices": state_indices,
                  "query_start_loc": a["query_start_loc"], "request_indices": None if requests is None else requests[:B],
                  "block_table": block_table, "num_computed": a.get("num_computed_tokens")}
        attrs = {**({"block_size": int(a["mamba_block_size"])} if block_table is not None else {}), **context_attrs}
        touched = state_indices.reshape(-1)
        if block_table is not None:  # align mode: the plan's final and boundary slots come from the table
            touched = torch.cat([touched, block_table.reshape(-1).to(touched.device, touched.dtype)])
        by_row = context_attrs.get("records") == RECORDS
        rows = torch.arange(B, dtype=torch.int32, device=state_indices.device) if by_row else state_indices
        layers = list(range(recording.layers))
        event = recording.begin(op_name.commit_layers, inputs, attrs, touched, rows, {}, recording.lower_bound,
                                layers=layers)
        self._in_commit, self._unrepresentable = f"{type(context).__name__}.commit", None
        try:
            result = recording.call(event, call)
            for field, column in (mirrored or {}).items():  # the plan the commit left, in the trace's copy
                getattr(plan, field)[:B].copy_(column[:B])
        finally:
            self._in_commit = None
        if self._unrepresentable is not None:
            recording.discard(event)
            recording.stop(self._unrepresentable)
            return result
        slots = written_slots(plan, state_indices, rows)
        pools = [recording.bound_on(i)["checkpoint_state"] for i in layers]
        convs = [recording.bound_on(i)["conv_state"] for i in layers]
        conv = recording.conv
        history = conv["width"] - 1
        windows = [c[slots.to(c.device)][:, :, :history] if conv["layout"] == "dim_first"
                   else c[slots.to(c.device)][:, :history] for c in convs]
        recording.end(event, {"slots": slots.to(torch.int32),
                              "states": torch.stack([p[slots.to(p.device)] for p in pools]),
                              "conv_windows": torch.stack(windows)})
        return result


def _arguments(function, first, args: tuple, kwargs: dict) -> dict[str, Any]:
    """``function(first, *args, **kwargs)``'s arguments by name, defaults included and a
    ``**kwargs`` parameter's entries among them. Raises ``TypeError`` when they do not bind."""
    call = inspect.signature(function).bind(first, *args, **kwargs)
    call.apply_defaults()
    out: dict[str, Any] = {}
    for name, value in call.arguments.items():
        kind = call.signature.parameters[name].kind
        out.update(value if kind is inspect.Parameter.VAR_KEYWORD else {name: value})
    return out


def context_plan(context) -> tuple[Any, dict[str, torch.Tensor] | None]:
    """A commit context's plan as the trace holds it, and the columns it mirrors: its ``plan``
    buffer itself (``None``), or, for the release's four columns of its own (allocated empty,
    each row written by a commit before it is read), a zeroed copy of the recorder's own that
    each recorded commit brings up to date (the columns); ``(None, None)`` when it has neither."""
    plan = getattr(context, "plan", None)
    if plan is not None and all(isinstance(getattr(plan, f, None), torch.Tensor) for f in PLAN_FIELDS):
        return plan, None
    if all(isinstance(getattr(context, f, None), torch.Tensor) for f in PLAN_FIELDS):
        columns = {f: getattr(context, f) for f in PLAN_FIELDS}
        return SimpleNamespace(**{f: torch.zeros_like(t) for f, t in columns.items()}), columns
    return None, None


def _layer_fields(layer) -> tuple[tuple, Any, Any, Any]:
    """``(kv_cache, A_log, dt_bias, gate_lower_bound)`` of a context's layer, ``kv_cache`` as
    kda's four buffers: an object with those attributes (the release's ``kv_cache =
    (conv_state, checkpoint_state)`` with its records in ``recoverssm_records``), or a tuple in
    ``kernels.context.engine.CommitLayer``'s order."""
    if hasattr(layer, "kv_cache"):
        kv_cache = tuple(layer.kv_cache)
        if len(kv_cache) == 2:
            kv_cache += (layer.recoverssm_records.correction, layer.recoverssm_records.key_gate)
        return kv_cache, layer.A_log, layer.dt_bias, layer.gate_lower_bound
    kv_cache, A_log, dt_bias, _, _, lower_bound = layer
    return tuple(kv_cache), A_log, dt_bias, lower_bound


__all__ = ["COMMIT_ARGS", "CUTE_NOTE", "ContextRecording", "context_plan"]
