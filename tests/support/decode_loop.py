"""A small synthetic decode loop that drives the kernel API the way a serving engine does.

``deferred``: each step flushes pending replays, then verify, plan, defer (some rows eager),
commit; a final flush at the end (``fused``: each step's flush and verify as one
``kda_recoverssm_flush_verify`` call, its plan and deferral as one
``kda_recoverssm_plan_deferred``). ``align``: prefix-caching align mode, verify, plan with a
block table, commit; every window is accepted in full, so it ends exactly on a block
boundary (the case the old ``c_end // bs`` column gets wrong). Three requests and one
CUDA-graph padding row per step.
"""

from __future__ import annotations

import torch

H, K, V, T = 2, 16, 16, 4
ACT = torch.bfloat16
LOWER_BOUND = -5.0
REQUESTS = 3
BATCH = 4
WIDTH = 4
"""Block-table columns per request in align mode (block size = T)."""


def decode_loop(api, mode: str = "deferred", steps: int = 3, seed: int = 0, device: str = "cpu",
                fused: bool = False, consume_pending: bool = True) -> None:
    """Run ``steps`` decode steps through ``api`` (a module or recorder with the kernel API).
    ``consume_pending`` is the unfused flushes' option (every row is deferred each step, so
    counts left in place are never folded twice)."""
    g = torch.Generator().manual_seed(seed)
    num_slots = 1 + REQUESTS * (WIDTH if mode == "align" else 1)
    pool = (torch.randn(num_slots, H, V, K, generator=g) * 0.5).to(device)
    pool[0] = 0
    records = api.allocate_records(BATCH, H, T, K, V, ACT, device)
    plan = api.CommitPlan.allocate(BATCH, device)
    pending = torch.zeros(BATCH, dtype=torch.int32, device=device)
    A_log = torch.log(torch.empty(H).uniform_(1.0, 16.0, generator=g)).to(device)
    dt_bias = (torch.randn(H * K, generator=g) * 0.5).to(device)
    keep = {} if consume_pending else {"consume_pending": False}  # modules without the option still run

    def i32(values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    rec_rows = i32([0, 1, 2, -1])
    if mode == "align":
        table = torch.zeros(BATCH, WIDTH, dtype=torch.int32)
        for r in range(REQUESTS):
            table[r] = torch.arange(1 + r * WIDTH, 1 + (r + 1) * WIDTH)
        table = table.to(device)
        computed = [T, T, T, 0]  # one block done per request
    for step in range(steps):
        if mode == "align":
            slots = i32([int(table[r, (computed[r] - 1) // T]) for r in range(REQUESTS)] + [-1])
        else:
            slots = i32([1, 2, 3, -1])
            if not fused:
                api.kda_recoverssm_flush(pool, records, A_log, dt_bias, LOWER_BOUND, slots, rec_rows, pending, plan,
                                         **keep)
        lens = [T, T if mode == "align" else 1 + (step + 1) % T, T, 0]
        qsl = i32([0, *torch.tensor(lens).cumsum(0).tolist()])
        total = sum(lens)
        q, k, raw_g = (torch.randn(1, total, H, K, generator=g).to(ACT).to(device) for _ in range(3))
        v = torch.randn(1, total, H, V, generator=g).to(ACT).to(device)
        raw_beta = torch.randn(1, total, H, generator=g).to(ACT).to(device)
        record_indices = rec_rows if mode == "deferred" else None
        if fused and mode == "deferred":
            api.kda_recoverssm_flush_verify(q, k, v, raw_g, raw_beta, A_log, dt_bias, LOWER_BOUND, pool, records, qsl,
                                            slots, T, rec_rows, pending, plan)
        else:
            api.kda_recoverssm_verify(q, k, v, raw_g, raw_beta, A_log, dt_bias, LOWER_BOUND, pool, records, qsl,
                                      slots, T, record_indices=record_indices)
        accepted = i32(lens if mode == "align" else [max(1, n - step % 2) for n in lens[:3]] + [0])
        if mode == "align":
            num_computed = i32(computed)
            api.kda_recoverssm_plan(plan, accepted, qsl, slots, T, table, num_computed, T)
            api.kda_recoverssm_commit(pool, records, A_log, dt_bias, LOWER_BOUND, slots, plan)
            computed = [c + n for c, n in zip(computed, lens)]
        else:
            eager = torch.tensor([step % 2 == 0, False, False, False], device=device)
            if fused:
                api.kda_recoverssm_plan_deferred(plan, accepted, qsl, slots, T, rec_rows, pending, eager)
            else:
                api.kda_recoverssm_plan(plan, accepted, qsl, slots, T)
                api.kda_recoverssm_defer(plan, slots, rec_rows, pending, eager)
            api.kda_recoverssm_commit(pool, records, A_log, dt_bias, LOWER_BOUND, slots, plan,
                                      record_indices=record_indices)
    if mode == "deferred":
        api.kda_recoverssm_flush(pool, records, A_log, dt_bias, LOWER_BOUND, i32([1, 2, 3, -1]), rec_rows, pending,
                                 plan, **keep)
