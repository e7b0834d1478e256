"""The bench workload: presets, what a run asks for, and ``n_sets`` disjoint decode layers.

For each batch size ``B`` and window ``T`` the workload holds ``n_sets`` disjoint copies of
one decode layer: each set has its own ``B`` state slots in one pool
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

With ``layers = L > 1`` the sets form ``n_sets / L`` models of ``L`` consecutive sets, and
one call of a row is one model's: every op above on each of its layers, except

    commit-layers  one ``kda_recoverssm_commit_layers`` of the model's L layers (where the
                   implementation has none: a commit a layer)
    step-stock     verify(s) for each layer; then one plan and one commit-layers
    commit-context one ``commit`` of the implementation's commit context over the model's
                   layers (``traces.replay.commit_context.commit_context_type``: kda's
                   ``kernels.context.engine`` for triton, a module's own where it has one):
                   plan through request indices, conv windows and state of every layer

A model's layers share the first set's slots and plan: layer ``j`` sees the pool through a
view ``j B`` slots further on, so the same slot indices name its own set's slots. Records
have a row per slot (row ``r`` is slot ``r``'s, row 0 the null slot's), so the same views
give a commit context its records per slot; with ``contexts``, a conv state pool
``[1 + n_sets*B, conv_channels, S]`` (``S = CONV_WIDTH - 1 + T - 1``, activation dtype) is
viewed the same way, and each model has its context, planning into its first set's plan.
"""

from __future__ import annotations

import math
import random
from types import ModuleType

import torch

from traces.bench.config import STATE_DTYPE_NAMES, Preset
from traces.bench.contract_bytes import CONV_WIDTH, Shape

STATE_DTYPES = {name: getattr(torch, name) for name in STATE_DTYPE_NAMES}
_MAX_SETS = 4096
_MEMORY_FRACTION = 0.5
# Ops that write the checkpoint pool and so need it restored before every sample.
_WRITES_STATE = {"commit", "flush", "flush-verify", "step-stock", "step-deferred", "commit-layers", "commit-context"}


def accepted_counts(accept: str, batch: int, spec_len: int, seed: int) -> list[int]:
    """``num_accepted`` per row: ``spec_len`` each, or uniform in ``0..spec_len`` seeded by
    ``(seed, batch, spec_len)`` so that adding batch sizes does not change other draws."""
    if accept == "full":
        return [spec_len] * batch
    rng = random.Random(f"{seed}:{batch}:{spec_len}")
    return [rng.randint(0, spec_len) for _ in range(batch)]


class Workload:
    """``n_sets`` disjoint layers of one (B, T) problem on ``device`` for one implementation.

    ``run(name)`` issues one sample of an op or step; ``restore(name)`` puts back what it
    consumes (pending counts, plan columns, and the state pool when the op writes it).
    """

    def __init__(self, impl: ModuleType, preset: Preset, state_dtype: torch.dtype, batch: int, spec_len: int,
                 counts: list[int], n_sets: int, device: str, seed: int, layers: int = 1, contexts: bool = False):
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
        self.records = impl.allocate_records(1 + n_sets * B, H, T, K, V, act, device)
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
            rows = slice(1 + s * B, 1 + (s + 1) * B)
            self.sets.append(dict(
                q=self.q[s:s + 1], k=self.k[s:s + 1], g=self.g[s:s + 1], v=self.v[s:s + 1],
                beta=self.beta[s:s + 1], out=self.out[s:s + 1], slots=self.slots[s],
                accepted=self.num_accepted[s], pending=self.pending[s],
                records=records_type(correction=self.records.correction[rows], key_gate=self.records.key_gate[rows]),
                plan=impl.CommitPlan(*(self.plan_columns[c, s] for c in range(4))),
            ))
        self.layers = layers
        self.models = [self.sets[g:g + layers] for g in range(0, n_sets - layers + 1, layers)]
        span = 1 + (n_sets - layers + 1) * B  # the slots every layer's view holds
        self.layer_tables = []
        if layers > 1 and all(hasattr(impl, name) for name in
                              ("kda_recoverssm_commit_layers", "LayerBuffers", "LayerTables")):
            self.layer_tables = [impl.LayerTables.of(
                impl.LayerBuffers(self.pool[j * B:j * B + span], d["records"], self.A_log, self.dt_bias)
                for j, d in enumerate(model)) for model in self.models]
        self.contexts = []
        if contexts:
            channels = Shape(H, K, V, act.itemsize, state_dtype.itemsize).conv_channels
            conv = randn(1 + n_sets * B, channels, CONV_WIDTH - 1 + T - 1, dtype=act)
            self.conv, self.pristine_conv = conv, conv.clone()
            self.requests = torch.arange(B, dtype=torch.int32, device=device)
            self.contexts = [self._context(g, span) for g in range(len(self.models))]

    def _context(self, g: int, span: int):
        """Model ``g``'s commit context: layer ``j`` over the pool, records and conv state seen
        ``j B`` slots further on, planning into the model's first set's plan."""
        from kernels.context.engine import CommitLayer
        from traces.replay.commit_context import commit_context_type

        B, H, _, K = self.slots.shape[1], *self.pool.shape[1:]
        views = [slice(j * B, j * B + span) for j in range(self.layers)]
        model = [CommitLayer((self.conv[v], self.pool[v], self.records.correction[v], self.records.key_gate[v]),
                             self.A_log, self.dt_bias, H, K, self.lower_bound) for v in views]
        context = commit_context_type(self.impl)[0].create(model, spec_query_len=self.T, max_num_reqs=B)
        context.plan = self.models[g][0]["plan"]
        return context

    @property
    def calls(self) -> int:
        """Calls per sample: one per set, or per model where there are several layers."""
        return len(self.models) if self.layers > 1 else self.n_sets

    def _commit_layers(self, g: int) -> None:
        """Model ``g``'s commit of every layer, with its first set's slots and plan."""
        first = self.models[g][0]
        if not self.layer_tables:
            for d in self.models[g]:
                self.impl.kda_recoverssm_commit(self.pool, d["records"], self.A_log, self.dt_bias, self.lower_bound,
                                                d["slots"], d["plan"])
            return
        self.impl.kda_recoverssm_commit_layers(self.layer_tables[g], self.lower_bound, first["slots"], first["plan"])

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
        if name == "commit-layers":
            for g in range(len(self.models)):
                self._commit_layers(g)
        elif name == "commit-context":
            for context, model in zip(self.contexts, self.models):
                first = model[0]
                context.commit(first["accepted"], first["slots"], self.qsl, request_indices=self.requests)
        elif name == "step-stock" and self.layers > 1:
            for g, model in enumerate(self.models):
                for d in model:
                    self._verify(d, None)
                self._plan(model[0])
                self._commit_layers(g)
        elif name == "step-stock":
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
        if name == "commit-context":
            self.conv.copy_(self.pristine_conv)

    def finite(self) -> bool:
        """Whether outputs, records, the state pool (and conv states) hold no NaN or Inf."""
        convs = (self.conv,) if self.contexts else ()
        return all(bool(torch.isfinite(t).all()) for t in
                   (self.out, self.pool, self.records.correction, self.records.key_gate, *convs))


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
