"""Synthetic traces from a small scheduler simulation (``kda synth``).

Requests arrive, decode for a few steps and finish; their state slots and record rows are
recycled. Each step's batch is padded to a CUDA-graph size (a power of two; the first step
the largest, ``max_batch``) with rows of length 0, whose slots are ``PAD_ID`` and the null
slot by turns over the run. A window is ``T`` tokens, now and then fewer, and a request's
last one always fewer (it reaches its length inside it), so the final records hold partial
windows, where a write past a window shows. At the defaults (8 requests, ``max_batch`` 4,
5 slots, 4 record rows) every trace has partial windows, padding rows with both slots, and
reused slots and record rows. Accepted lengths follow an acceptance rate (each draft token
accepted with probability ``acceptance`` until the first rejection). Modes:

stock     verify, plan, commit every step (record row = batch row). With several layers or
          conv state (format v2): each step a verify a layer (records at the row's slot),
          each followed by the engine's conv update of that layer (a ``write``), then one
          ``commit_layers`` of every layer, its accepted counts read through a shuffled
          ``request_indices``.
deferred  verify, plan, defer, commit; records are indexed by request, so a request's
          pending replay is flushed before its next verify, before its slot is freed,
          and at the end.
mixed     like deferred, with eager rows (committed at once) and some stock steps
          (no defer); pending replays are flushed before those as well.

Flushes follow the documented kernels' lifecycle (docs/design.md §7): the flush plan reads
the pending counts and leaves them (``consume_pending`` false), the next defer overwrites
the count of every row it defers, and only a request with a window still pending is
flushed. A request admitted into a slot or record row that served another request before
gets a prefill outside the kernels, recorded as a ``write`` event: a fresh state in its
slot and, in the deferred modes, its record row's count reset (a slot used for the first
time holds its initial state already).

Expected results come from ``kernels.reference`` (and ``kernels.context.reference`` for
the engine's commit) run on a float64 copy of the buffers, cast to the trace's dtypes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from kernels import reference as ref
from traces.format.io import TraceBuilder
from traces.format.schema import NULL_ID, PAD_ID, PLAN_FIELDS, BufferSizes, ConvSpec, Manifest
from traces.synth.config import PRESETS, SynthConfig
from traces.format.validate import TORCH_DTYPES
from traces.ops.table import op_name

DEFAULT_CONV_WIDTH = 4
"""Conv width of an engine-commit trace without ``conv_width``."""


@dataclass
class _Layer:
    """One layer's parameters and float64 buffers (records' key/gate and the conv state, or
    None, in activation dtype)."""

    A_log: torch.Tensor
    dt_bias: torch.Tensor
    pool: torch.Tensor
    records: Any
    pending: torch.Tensor
    conv: torch.Tensor | None


@dataclass
class _Request:
    slot: int
    record_row: int
    steps_left: int
    pending: int = 0


def synthesize(config: SynthConfig, progress: Callable[[int, int], None] | None = None) -> TraceBuilder:
    """Simulate ``config`` and return the trace, ready for ``TraceBuilder.write``.
    ``progress(finished, requests)`` is called after every decode step."""
    config.check()
    return _Simulation(config).run(progress)


class _Simulation:
    def __init__(self, cfg: SynthConfig):
        self.cfg = cfg
        p = PRESETS[cfg.preset]
        self.dims = d = p.dims
        self.lower_bound = p.lower_bound
        self.act = TORCH_DTYPES[p.activation_dtype]
        self.state_dtype = TORCH_DTYPES[p.state_dtype]
        self.num_slots = cfg.num_slots or cfg.max_batch + 2
        self.num_rows = cfg.num_record_rows or cfg.max_batch
        self.rng = np.random.default_rng(cfg.seed)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        if cfg.engine_commit:
            self.num_rows = self.num_slots  # records per slot
        sizes = BufferSizes(self.num_slots, self.num_rows, cfg.max_batch)
        from traces.format.provenance import trace_provenance

        steps = "" if cfg.steps is None else f" --steps {cfg.steps}"
        engine = (f" --layers {cfg.layers} --conv-width {cfg.conv_width or DEFAULT_CONV_WIDTH} --conv-layout "
                  f"{cfg.conv_layout}") if cfg.engine_commit else ""
        note = cfg.note or (f"kda synth --preset {cfg.preset} --mode {cfg.mode} --requests {cfg.requests}"
                            f"{steps} --seed {cfg.seed} --acceptance {cfg.acceptance} --max-batch {cfg.max_batch}"
                            f"{engine}")
        self.conv = ConvSpec(cfg.conv_layout, 3 * d.H * d.K, cfg.conv_width or DEFAULT_CONV_WIDTH) \
            if cfg.engine_commit else None
        manifest = Manifest(d, p.activation_dtype, p.state_dtype, p.lower_bound, sizes, {}, {},
                            provenance=trace_provenance("kda synth", note=note), conv=self.conv)
        self.out = TraceBuilder(manifest)

        self.layers = [self.new_layer() for _ in range(cfg.layers)]
        self.plan = ref.CommitPlan.allocate(cfg.max_batch, "cpu")
        for i, layer in enumerate(self.layers):
            self.out.set_params(layer.A_log, layer.dt_bias, layer=i)
            self.out.set_buffers("initial", self.buffers(layer), layer=i)
        self.context = self.commit_context() if cfg.engine_commit else None

        self.free_slots = list(range(NULL_ID + 1, self.num_slots))
        self.free_rows = list(range(self.num_rows))
        self.waiting = cfg.requests
        self.live: list[_Request] = []
        self.used_slots: set[int] = set()
        self.used_rows: set[int] = set()
        self.padding_slots = 0
        self.steps = 0

    def new_layer(self) -> _Layer:
        """A layer's random parameters, random checkpoints (and conv state), empty records."""
        d = self.dims
        A_log = torch.log(torch.empty(d.H).uniform_(1.0, 16.0, generator=self.gen))
        # most key channels keep a long memory (decay near 1), some forget fast, as in trained models
        dt_bias = torch.randn(d.H * d.K, generator=self.gen) * 1.5 - 2.0
        pool = torch.randn(self.num_slots, d.H, d.V, d.K, generator=self.gen).to(self.state_dtype) * 0.5
        pool[NULL_ID] = 0
        records = ref.allocate_records(self.num_rows, d.H, d.T, d.K, d.V, self.act, "cpu")
        records.correction = records.correction.to(torch.float64)
        conv = None
        if self.conv is not None:
            S = self.conv.width - 1 + d.T - 1
            shape = (self.num_slots, self.conv.dim, S) if self.conv.layout == "dim_first" else \
                (self.num_slots, S, self.conv.dim)
            conv = self.randn(*shape)
            conv[NULL_ID] = 0
        # float64 copies evolve under the reference; the trace gets them cast to its dtypes
        return _Layer(A_log, dt_bias, pool.to(torch.float64), records, torch.zeros(self.num_rows, dtype=torch.int32),
                      conv)

    def commit_context(self):
        """The reference's commit context over every layer, planning into the trace's plan."""
        from kernels.context.engine import CommitLayer
        from kernels.context.reference import ReferenceCommitContext

        d = self.dims
        model = [CommitLayer((x.conv, x.pool, x.records.correction, x.records.key_gate), x.A_log, x.dt_bias, d.H,
                             d.K, self.lower_bound) for x in self.layers]
        context = ReferenceCommitContext.create(model, spec_query_len=d.T, max_num_reqs=self.cfg.max_batch,
                                                conv_dim_first=self.conv.layout == "dim_first")
        context.plan = self.plan
        return context

    def buffers(self, layer: _Layer) -> dict[str, torch.Tensor]:
        return {
            "checkpoint_state": layer.pool.to(self.state_dtype),
            "records.correction": layer.records.correction.to(torch.float32),
            "records.key_gate": layer.records.key_gate,
            "pending": layer.pending,
            **{f"plan.{f}": getattr(self.plan, f) for f in PLAN_FIELDS},
            **({"conv_state": layer.conv} if layer.conv is not None else {}),
        }

    def keep(self, expected: dict[str, torch.Tensor], big: bool = False) -> dict[str, torch.Tensor]:
        mode = self.cfg.keep_expected
        return {} if mode == "none" or (big and mode == "outputs") else expected

    # -- the scheduler ----------------------------------------------------------------

    def run(self, progress: Callable[[int, int], None] | None = None) -> TraceBuilder:
        deferred_mode = self.cfg.mode != "stock"
        step = 0
        while (self.waiting or self.live) and (self.cfg.steps is None or step < self.cfg.steps):
            self.admit()
            if self.live:
                stock_step = not deferred_mode or (self.cfg.mode == "mixed" and self.rng.random() < self.cfg.stock_fraction)
                self.decode_step(stock_step)
                self.retire()
            step += 1
            if progress is not None:
                progress(self.cfg.requests - self.waiting - len(self.live), self.cfg.requests)
        if deferred_mode:
            self.flush(self.live)
        for i, layer in enumerate(self.layers):
            self.out.set_buffers("final", self.buffers(layer), layer=i)
        return self.out

    def admit(self) -> None:
        arrivals = int(self.rng.integers(0, 3)) if self.live else max(1, int(self.rng.integers(0, 3)))
        live_cap = self.cfg.max_batch - (1 if self.cfg.max_batch > 1 else 0)  # leave room for a padding row
        for _ in range(arrivals):
            if not (self.waiting and self.free_slots and self.free_rows and len(self.live) < max(1, live_cap)):
                return
            slot = self.free_slots.pop(int(self.rng.integers(len(self.free_slots))))
            row = self.free_rows.pop(int(self.rng.integers(len(self.free_rows))))
            self.live.append(_Request(slot, row, int(self.rng.integers(1, self.cfg.max_decode_steps + 1))))
            self.waiting -= 1
            if slot in self.used_slots or row in self.used_rows:
                self.prefill(slot, row)
            self.used_slots.add(slot)
            self.used_rows.add(row)

    def prefill(self, slot: int, row: int) -> None:
        """The engine's writes for a request admitted into a reused slot or record row: a
        fresh state (and conv state) in its slot in every layer and, when records are indexed
        by request, no pending window on its record row."""
        d = self.dims
        for i, layer in enumerate(self.layers):
            state = (torch.randn(d.H, d.V, d.K, generator=self.gen) * 0.5).to(self.state_dtype)
            layer.pool[slot] = state.to(torch.float64)
            written = {"slots": torch.tensor([slot], dtype=torch.int32), "states": state[None]}
            if self.cfg.mode != "stock":
                layer.pending[row] = 0
                written["pending"] = layer.pending.clone()
            if layer.conv is not None:
                layer.conv[slot] = self.randn(*layer.conv.shape[1:])
                written.update(conv_slots=written["slots"], conv_states=layer.conv[slot][None])
            self.out.add_event(op_name.write, written, attrs={"layer": i} if i else None)

    def retire(self) -> None:
        done = [r for r in self.live if r.steps_left <= 0]
        if self.cfg.mode != "stock":
            self.flush(done)  # before the slot is freed
        for r in done:
            self.live.remove(r)
            self.free_slots.append(r.slot)
            self.free_rows.append(r.record_row)

    def padded(self, reqs: list[_Request], largest: bool = False) -> tuple[list[_Request | None], int]:
        """Rows of a step: the requests in random order, then padding rows up to a CUDA-graph
        size (a power of two, at most ``max_batch``; ``max_batch`` itself when ``largest``)."""
        rows: list[_Request | None] = [reqs[i] for i in self.rng.permutation(len(reqs))]
        size = 1
        while size < len(rows):
            size *= 2
        size = max(self.cfg.max_batch if largest else min(size, self.cfg.max_batch), len(rows))
        rows += [None] * (size - len(rows))
        return rows, size

    def index_column(self, rows: list[_Request | None], attr: str) -> torch.Tensor:
        """Slots or record rows of each row; a padding row's record row is PAD_ID, its slot
        PAD_ID and the null slot by turns over the run."""
        values = []
        for r in rows:
            if r is not None:
                values.append(getattr(r, attr))
            elif attr == "record_row":
                values.append(PAD_ID)
            else:
                values.append(NULL_ID if self.padding_slots % 2 else PAD_ID)
                self.padding_slots += 1
        return torch.tensor(values, dtype=torch.int32)

    def randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen).to(self.act)

    def decode_step(self, stock_step: bool) -> None:
        d, cfg = self.dims, self.cfg
        stock_mode = cfg.mode == "stock"
        if not stock_mode:
            self.flush([r for r in self.live if r.pending > 0])  # before a verify overwrites the record rows
        rows, batch = self.padded(self.live, largest=not self.steps)
        self.steps += 1
        lens = [0 if r is None else self.window(r) for r in rows]
        qsl = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)
        slots = self.index_column(rows, "slot")
        rec = slots if cfg.engine_commit else None if stock_mode else self.index_column(rows, "record_row")
        for i, layer in enumerate(self.layers):
            self.verify(i, layer, qsl, slots, rec)
            if layer.conv is not None:
                self.conv_update(i, layer, slots)

        accepted = torch.tensor([0 if r is None else self.accepted(n) for r, n in zip(rows, lens)], dtype=torch.int32)
        if cfg.engine_commit:
            self.commit_layers(accepted, qsl, slots)
        else:
            self.plan_and_commit(stock_step, rows, accepted, qsl, slots, rec)
        for r in self.live:
            r.steps_left -= 1

    def verify(self, index: int, layer: _Layer, qsl: torch.Tensor, slots: torch.Tensor,
               rec: torch.Tensor | None) -> None:
        """A verify of layer ``index`` on random inputs."""
        d = self.dims
        total, batch = int(qsl[-1]), slots.shape[0]
        q, k, raw_g = (self.randn(1, total, d.H, d.K) for _ in range(3))
        v = self.randn(1, total, d.H, d.V)
        raw_beta = self.randn(1, total, d.H)
        out = ref.kda_recoverssm_verify(q, k, v, raw_g, raw_beta, layer.A_log, layer.dt_bias, self.lower_bound,
                                        layer.pool, layer.records, qsl, slots, d.T, record_indices=rec)
        rec_rows = (rec if rec is not None else torch.arange(batch, dtype=torch.int32)).long().clamp(min=0)
        self.out.add_event(op_name.verify, {
            "q": q, "k": k, "v": v, "raw_g": raw_g, "raw_beta": raw_beta, "query_start_loc": qsl,
            "state_indices": slots, "record_indices": rec,
        }, self.keep({
            "out": out.to(self.act),
            "records.correction": layer.records.correction[rec_rows].to(torch.float32),
            "records.key_gate": layer.records.key_gate[rec_rows],
        }), {"layer": index} if index else None)

    def conv_update(self, index: int, layer: _Layer, slots: torch.Tensor) -> None:
        """The engine's convolution update of layer ``index`` during its verify, recorded as a
        ``write``: each real slot's conv state becomes its last ``S`` inputs, the history but
        the oldest entry followed by ``T`` new inputs (docs/design.md §10)."""
        real = sorted({s for s in slots.tolist() if s > NULL_ID})
        if not real:
            return
        view = layer.conv if self.conv.layout == "dim_first" else layer.conv.transpose(1, 2)
        history = self.conv.width - 1
        for slot in real:
            inputs = torch.cat([view[slot, :, :history], self.randn(self.conv.dim, self.dims.T)], dim=1)
            view[slot] = inputs[:, 1:]
        index_tensor = torch.tensor(real, dtype=torch.int32)
        self.out.add_event(op_name.write, {"conv_slots": index_tensor, "conv_states": layer.conv[index_tensor.long()]},
                           attrs={"layer": index} if index else None)

    def commit_layers(self, accepted: torch.Tensor, qsl: torch.Tensor, slots: torch.Tensor) -> None:
        """The engine's commit of every layer: the rows' accepted counts placed at shuffled
        request positions among ``B + 2`` requests (the others random), read through
        ``request_indices``."""
        d, batch = self.dims, slots.shape[0]
        requests = torch.tensor(self.rng.permutation(batch + 2)[:batch], dtype=torch.int32)
        per_request = torch.tensor(self.rng.integers(0, d.T + 1, batch + 2), dtype=torch.int32)
        per_request[requests.long()] = accepted
        self.context.commit(per_request, slots, qsl, request_indices=requests)
        index = torch.tensor(self.commit_targets(slots, slots, batch), dtype=torch.int32).long()
        history = self.conv.width - 1
        windows = [x.conv[index][:, :, :history] if self.conv.layout == "dim_first" else x.conv[index][:, :history]
                   for x in self.layers]
        self.out.add_event(op_name.commit_layers, {
            "num_accepted": per_request, "state_indices": slots, "query_start_loc": qsl, "request_indices": requests,
        }, {**self.keep({"slots": index.int(), "conv_windows": torch.stack(windows)}),
            **self.keep({"states": torch.stack([x.pool[index].to(self.state_dtype) for x in self.layers])}, big=True)})

    def plan_and_commit(self, stock_step: bool, rows: list[_Request | None], accepted: torch.Tensor,
                        qsl: torch.Tensor, slots: torch.Tensor, rec: torch.Tensor | None) -> None:
        """One layer's plan, defer (unless ``stock_step``) and commit."""
        d, cfg, layer = self.dims, self.cfg, self.layers[0]
        batch = slots.shape[0]
        ref.kda_recoverssm_plan(self.plan, accepted, qsl, slots, d.T)
        self.out.add_event(op_name.plan, {"num_accepted": accepted, "query_start_loc": qsl, "state_indices": slots},
                           self.keep({f: getattr(self.plan, f)[:batch] for f in PLAN_FIELDS}))

        if not stock_step:
            eager = None
            if cfg.mode == "mixed":
                eager = torch.tensor([r is not None and self.rng.random() < cfg.eager_fraction for r in rows])
            lens_before = self.plan.commit_lens[:batch].clone()
            ref.kda_recoverssm_defer(self.plan, slots, rec, layer.pending, eager)
            for b, r in enumerate(rows):
                if r is not None:
                    r.pending = 0 if eager is not None and bool(eager[b]) else int(lens_before[b])
            self.out.add_event(op_name.defer, {"state_indices": slots, "record_rows": rec, "eager": eager},
                               self.keep({"pending": layer.pending, "commit_lens": self.plan.commit_lens[:batch]}))

        written = self.commit_targets(slots, rec, batch)
        ref.kda_recoverssm_commit(layer.pool, layer.records, layer.A_log, layer.dt_bias, self.lower_bound, slots,
                                  self.plan, record_indices=rec)
        self.out.add_event(op_name.commit, {"state_indices": slots, "record_indices": rec}, self.written(written))

    def window(self, r: _Request) -> int:
        """A request's window this step: ``T`` tokens or now and then fewer; fewer at its last step."""
        T = self.dims.T
        if r.steps_left <= 1 and T > 1:
            return int(self.rng.integers(1, T))
        return T if self.rng.random() < 0.85 else int(self.rng.integers(1, T + 1))

    def accepted(self, query_len: int) -> int:
        """Accepted tokens of a window: the bonus token plus drafts up to the first rejection."""
        n = 1
        while n < query_len and self.rng.random() < self.cfg.acceptance:
            n += 1
        return n

    def commit_targets(self, slots: torch.Tensor, rec: torch.Tensor | None, batch: int) -> list[int]:
        """Slots the coming commit writes, read from the plan (docs/design.md §6)."""
        p = self.plan.rows(batch)
        rec_rows = rec if rec is not None else torch.arange(batch)
        targets: list[int] = []
        for b in range(batch):
            if int(p.commit_lens[b]) > 0 and int(slots[b]) > NULL_ID and int(rec_rows[b]) >= 0:
                for s, n in ((int(p.final_state_indices[b]), 1), (int(p.boundary_state_indices[b]),
                                                                    int(p.boundary_recovery_lens[b]))):
                    if s > NULL_ID and n >= 1 and s not in targets:
                        targets.append(s)
        return targets

    def written(self, slots: list[int]) -> dict[str, torch.Tensor]:
        """A one-layer commit's or flush's expected slots and states."""
        index = torch.tensor(slots, dtype=torch.int32)
        return self.keep({"slots": index, "states": self.layers[0].pool[index.long()].to(self.state_dtype)}, big=True)

    def flush(self, reqs: list[_Request]) -> None:
        """A flush event over those of ``reqs`` with a pending replay (padded), if any. The
        counts stay in ``pending``: a request flushed once is not flushed again until its
        next deferral (its count would fold the same window twice)."""
        reqs = [r for r in reqs if r.pending > 0]
        if not reqs:
            return
        rows, _ = self.padded(reqs)
        slots = self.index_column(rows, "slot")
        rec = self.index_column(rows, "record_row")
        layer = self.layers[0]  # deferred modes are single-layer
        ref.kda_recoverssm_flush(layer.pool, layer.records, layer.A_log, layer.dt_bias, self.lower_bound, slots, rec,
                                 layer.pending, self.plan, consume_pending=False)
        expected = self.written([r.slot for r in reqs])
        if self.cfg.keep_expected != "none":
            expected["pending"] = layer.pending
        self.out.add_event(op_name.flush, {"state_indices": slots, "record_rows": rec}, expected,
                           {"consume_pending": False})
        for r in reqs:
            r.pending = 0
