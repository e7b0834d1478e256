"""Synthetic traces from a small scheduler simulation (``kda synth``).

Requests arrive, decode for a few steps and finish; their state slots and record rows are
recycled. Each step's batch is padded to a CUDA-graph size with null rows of length 0.
Accepted lengths follow an acceptance rate (each draft token accepted with probability
``acceptance`` until the first rejection). Modes:

stock     verify, plan, commit every step (record row = batch row).
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

Expected results come from ``kernels.reference`` run on a float64 copy of the buffers,
cast to the trace's dtypes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from kernels import reference as ref
from traces.format.io import TraceBuilder
from traces.format.schema import NULL_ID, PAD_ID, PLAN_FIELDS, BufferSizes, Manifest
from traces.synth.config import PRESETS, SynthConfig
from traces.format.validate import TORCH_DTYPES

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
        sizes = BufferSizes(self.num_slots, self.num_rows, cfg.max_batch)
        from traces.format.provenance import trace_provenance

        steps = "" if cfg.steps is None else f" --steps {cfg.steps}"
        note = cfg.note or (f"kda synth --preset {cfg.preset} --mode {cfg.mode} --requests {cfg.requests}"
                            f"{steps} --seed {cfg.seed} --acceptance {cfg.acceptance} --max-batch {cfg.max_batch}")
        manifest = Manifest(d, p.activation_dtype, p.state_dtype, p.lower_bound, sizes, {}, {},
                            provenance=trace_provenance("kda synth", note=note))
        self.out = TraceBuilder(manifest)

        self.A_log = torch.log(torch.empty(d.H).uniform_(1.0, 16.0, generator=self.gen))
        # most key channels keep a long memory (decay near 1), some forget fast, as in trained models
        self.dt_bias = torch.randn(d.H * d.K, generator=self.gen) * 1.5 - 2.0
        self.out.set_params(self.A_log, self.dt_bias)
        pool = torch.randn(self.num_slots, d.H, d.V, d.K, generator=self.gen).to(self.state_dtype) * 0.5
        pool[NULL_ID] = 0
        # float64 copies evolve under the reference; the trace gets them cast to its dtypes
        self.pool = pool.to(torch.float64)
        self.records = ref.allocate_records(self.num_rows, d.H, d.T, d.K, d.V, self.act, "cpu")
        self.records.correction = self.records.correction.to(torch.float64)
        self.pending = torch.zeros(self.num_rows, dtype=torch.int32)
        self.plan = ref.CommitPlan.allocate(cfg.max_batch, "cpu")
        self.out.set_buffers("initial", self.buffers())

        self.free_slots = list(range(NULL_ID + 1, self.num_slots))
        self.free_rows = list(range(self.num_rows))
        self.waiting = cfg.requests
        self.live: list[_Request] = []
        self.used_slots: set[int] = set()
        self.used_rows: set[int] = set()

    def buffers(self) -> dict[str, torch.Tensor]:
        return {
            "checkpoint_state": self.pool.to(self.state_dtype),
            "records.correction": self.records.correction.to(torch.float32),
            "records.key_gate": self.records.key_gate,
            "pending": self.pending,
            **{f"plan.{f}": getattr(self.plan, f) for f in PLAN_FIELDS},
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
        self.out.set_buffers("final", self.buffers())
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
        fresh state in its slot and, when records are indexed by request, no pending window
        on its record row."""
        d = self.dims
        state = (torch.randn(d.H, d.V, d.K, generator=self.gen) * 0.5).to(self.state_dtype)
        self.pool[slot] = state.to(torch.float64)
        written = {"slots": torch.tensor([slot], dtype=torch.int32), "states": state[None]}
        if self.cfg.mode != "stock":
            self.pending[row] = 0
            written["pending"] = self.pending.clone()
        self.out.add_event("write", written)

    def retire(self) -> None:
        done = [r for r in self.live if r.steps_left <= 0]
        if self.cfg.mode != "stock":
            self.flush(done)  # before the slot is freed
        for r in done:
            self.live.remove(r)
            self.free_slots.append(r.slot)
            self.free_rows.append(r.record_row)

    def padded(self, reqs: list[_Request]) -> tuple[list[_Request | None], int]:
        """Rows of a step: the requests in random order, then null padding rows up to a
        CUDA-graph size (a power of two, at most ``max_batch``)."""
        rows: list[_Request | None] = [reqs[i] for i in self.rng.permutation(len(reqs))]
        size = 1
        while size < len(rows):
            size *= 2
        size = max(min(size, self.cfg.max_batch), len(rows))
        rows += [None] * (size - len(rows))
        return rows, size

    def index_column(self, rows: list[_Request | None], attr: str) -> torch.Tensor:
        """Slots or record rows of each row; padding rows alternate between PAD_ID and the null slot."""
        values = []
        for b, r in enumerate(rows):
            if r is not None:
                values.append(getattr(r, attr))
            else:
                values.append(PAD_ID if attr == "record_row" or b % 2 else NULL_ID)
        return torch.tensor(values, dtype=torch.int32)

    def randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen).to(self.act)

    def decode_step(self, stock_step: bool) -> None:
        d, cfg = self.dims, self.cfg
        stock_mode = cfg.mode == "stock"
        if not stock_mode:
            self.flush([r for r in self.live if r.pending > 0])  # before a verify overwrites the record rows
        rows, batch = self.padded(self.live)
        lens = [0 if r is None else (d.T if self.rng.random() < 0.85 else int(self.rng.integers(1, d.T + 1)))
                for r in rows]
        qsl = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)
        total = int(qsl[-1])
        slots = self.index_column(rows, "slot")
        rec = None if stock_mode else self.index_column(rows, "record_row")

        q, k, raw_g = (self.randn(1, total, d.H, d.K) for _ in range(3))
        v = self.randn(1, total, d.H, d.V)
        raw_beta = self.randn(1, total, d.H)
        out = ref.kda_recoverssm_verify(q, k, v, raw_g, raw_beta, self.A_log, self.dt_bias, self.lower_bound,
                                        self.pool, self.records, qsl, slots, d.T, record_indices=rec)
        rec_rows = (rec if rec is not None else torch.arange(batch, dtype=torch.int32)).long().clamp(min=0)
        self.out.add_event("verify", {
            "q": q, "k": k, "v": v, "raw_g": raw_g, "raw_beta": raw_beta, "query_start_loc": qsl,
            "state_indices": slots, "record_indices": rec,
        }, self.keep({
            "out": out.to(self.act),
            "records.correction": self.records.correction[rec_rows].to(torch.float32),
            "records.key_gate": self.records.key_gate[rec_rows],
        }))

        accepted = torch.tensor([0 if r is None else self.accepted(n) for r, n in zip(rows, lens)], dtype=torch.int32)
        ref.kda_recoverssm_plan(self.plan, accepted, qsl, slots, d.T)
        self.out.add_event("plan", {"num_accepted": accepted, "query_start_loc": qsl, "state_indices": slots},
                           self.keep({f: getattr(self.plan, f)[:batch] for f in PLAN_FIELDS}))

        if not stock_step:
            eager = None
            if cfg.mode == "mixed":
                eager = torch.tensor([r is not None and self.rng.random() < cfg.eager_fraction for r in rows])
            lens_before = self.plan.commit_lens[:batch].clone()
            ref.kda_recoverssm_defer(self.plan, slots, rec, self.pending, eager)
            for b, r in enumerate(rows):
                if r is not None:
                    r.pending = 0 if eager is not None and bool(eager[b]) else int(lens_before[b])
            self.out.add_event("defer", {"state_indices": slots, "record_rows": rec, "eager": eager},
                               self.keep({"pending": self.pending, "commit_lens": self.plan.commit_lens[:batch]}))

        written = self.commit_targets(slots, rec, batch)
        ref.kda_recoverssm_commit(self.pool, self.records, self.A_log, self.dt_bias, self.lower_bound, slots,
                                  self.plan, record_indices=rec)
        self.out.add_event("commit", {"state_indices": slots, "record_indices": rec}, self.written(written))
        for r in self.live:
            r.steps_left -= 1

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
        index = torch.tensor(slots, dtype=torch.int32)
        return self.keep({"slots": index, "states": self.pool[index.long()].to(self.state_dtype)}, big=True)

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
        ref.kda_recoverssm_flush(self.pool, self.records, self.A_log, self.dt_bias, self.lower_bound, slots, rec,
                                 self.pending, self.plan, consume_pending=False)
        expected = self.written([r.slot for r in reqs])
        if self.cfg.keep_expected != "none":
            expected["pending"] = self.pending
        self.out.add_event("flush", {"state_indices": slots, "record_rows": rec}, expected,
                           {"consume_pending": False})
        for r in reqs:
            r.pending = 0
