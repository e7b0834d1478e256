"""A correct serving engine with a random schedule, driving the kernel API as engines do and
writing its buffers between the calls: requests arrive and finish, slots and record rows are
reused after a prefill writes a fresh state, a prefix-cache hit copies one slot into another,
finished requests' record rows and counts are reset, batches are padded for CUDA graphs,
some live rows carry a null slot for a step, and steps are deferred (eager rows among them)
or stock. Its flushes fold only windows still pending, so they are correct whether the
flush consumes the counts or leaves them (``consume_pending``)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

H, K, V, T = 2, 16, 16, 4
ACT = torch.bfloat16
LOWER_BOUND = -5.0
SLOTS, ROWS, BATCH = 7, 4, 4


@dataclass
class _Request:
    slot: int
    row: int
    steps_left: int
    pending: bool = False


def run_engine(api, seed: int, steps: int = 6, device: str = "cpu", consume_pending: bool = True) -> None:
    """Run a random schedule of ``steps`` decode steps through ``api`` (a module or a recorder)."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    pool = (torch.randn(SLOTS, H, V, K, generator=g) * 0.5).to(device)
    pool[0] = 0
    records = api.allocate_records(ROWS, H, T, K, V, ACT, device)
    plan = api.CommitPlan.allocate(BATCH, device)
    pending = torch.zeros(ROWS, dtype=torch.int32, device=device)
    A_log = torch.log(torch.empty(H).uniform_(1.0, 16.0, generator=g)).to(device)
    dt_bias = (torch.randn(H * K, generator=g) * 0.5).to(device)
    free_slots, free_rows = list(range(1, SLOTS)), list(range(ROWS))
    live: list[_Request] = []

    def i32(values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    def padded(reqs: list[_Request]) -> tuple[torch.Tensor, torch.Tensor]:
        order = rng.sample(reqs, len(reqs))
        pad = BATCH - len(order)
        return (i32([r.slot for r in order] + [rng.choice([-1, 0]) for _ in range(pad)]),
                i32([r.row for r in order] + [-1] * pad))

    def flush(reqs: list[_Request]) -> None:
        reqs = [r for r in reqs if r.pending]
        if reqs:
            slots, rows = padded(reqs)
            api.kda_recoverssm_flush(pool, records, A_log, dt_bias, LOWER_BOUND, slots, rows, pending, plan,
                                     consume_pending=consume_pending)
            for r in reqs:
                r.pending = False

    for _ in range(steps):
        while free_slots and free_rows and len(live) < BATCH - 1 and (not live or rng.random() < 0.6):
            slot, row = free_slots.pop(rng.randrange(len(free_slots))), free_rows.pop(rng.randrange(len(free_rows)))
            donor = [r.slot for r in live]
            if donor and rng.random() < 0.3:  # a prefix-cache hit: the state copied from another slot
                pool[slot] = pool[rng.choice(donor)]
            else:  # a prefill
                pool[slot] = (torch.randn(H, V, K, generator=g) * 0.5).to(device)
            pending[row] = 0
            live.append(_Request(slot, row, rng.randint(1, 4)))
        if not live:
            continue
        deferred = rng.random() < 0.7
        flush(live)
        slots, rows = padded(live)
        if rng.random() < 0.2:  # a live row without a state this step
            slots[0] = 0
        lens = [rng.randint(1, T) if int(s) > 0 or rng.random() < 0.5 else 0 for s in slots.tolist()]
        lens = [n if int(s) != -1 else 0 for n, s in zip(lens, slots.tolist())]
        qsl = i32([0, *torch.tensor(lens).cumsum(0).tolist()])
        total = sum(lens)
        q, k, raw_g = (torch.randn(1, total, H, K, generator=g).to(ACT).to(device) for _ in range(3))
        v = torch.randn(1, total, H, V, generator=g).to(ACT).to(device)
        raw_beta = torch.randn(1, total, H, generator=g).to(ACT).to(device)
        api.kda_recoverssm_verify(q, k, v, raw_g, raw_beta, A_log, dt_bias, LOWER_BOUND, pool, records, qsl, slots,
                                  T, record_indices=rows)
        accepted = i32([rng.randint(0, n) for n in lens])
        api.kda_recoverssm_plan(plan, accepted, qsl, slots, T)
        if deferred:
            eager = torch.tensor([rng.random() < 0.3 for _ in range(BATCH)], device=device)
            api.kda_recoverssm_defer(plan, slots, rows, pending, eager)
            by_row = {r.row: r for r in live}
            for b, (s, row) in enumerate(zip(slots.tolist(), rows.tolist())):
                if s > 0 and row in by_row and not bool(eager[b]):
                    by_row[row].pending = True
        api.kda_recoverssm_commit(pool, records, A_log, dt_bias, LOWER_BOUND, slots, plan, record_indices=rows)
        for r in live:
            r.steps_left -= 1
        done = [r for r in live if r.steps_left <= 0]
        flush(done)  # before the slot is freed
        for r in done:
            live.remove(r)
            records.correction[r.row] = 0  # the engine clears a finished request's records
            free_slots.append(r.slot)
            free_rows.append(r.row)
    flush(live)
