"""A serving engine's decode loop, unedited for recording: verify and the two raw kernels from
the engine's module (``tests.support.documented_surface``), the stock plan and the commit from
``kernels``; two layers, each with its own state pool, records, pending counts and plan.

Each step flushes pending windows (the flush plan kernel, then a commit), verifies, plans,
and, on deferred steps, defers (row 0 eager on even steps) before the commit; stock steps
commit at once. Prints a checksum of each layer's state after every step.

Usage: python3 tests/support/engine_script.py [STEPS]
"""

import sys

import torch

import kernels
from tests.support import documented_surface as engine

H, K, V, T = 2, 16, 16, 4
LAYERS, BATCH = 2, 4
LOWER_BOUND = -5.0
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def i32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def layer_buffers(g: torch.Generator) -> dict:
    pool = (torch.randn(4, H, V, K, generator=g) * 0.5).to(DEVICE)
    pool[0] = 0
    return {"pool": pool, "records": kernels.allocate_records(BATCH, H, T, K, V, torch.bfloat16, DEVICE),
            "pending": torch.zeros(BATCH, dtype=torch.int32, device=DEVICE),
            "plan": kernels.CommitPlan.allocate(BATCH, DEVICE),
            "A_log": torch.log(torch.empty(H).uniform_(1.0, 16.0, generator=g)).to(DEVICE),
            "dt_bias": (torch.randn(H * K, generator=g) * 0.5).to(DEVICE)}


def flush(layer: dict, slots: torch.Tensor, rows: torch.Tensor) -> None:
    plan = layer["plan"]
    engine._prepare_flush_plan_kernel[(slots.shape[0],)](
        slots, rows, layer["pending"], plan.commit_lens, plan.final_state_indices, plan.boundary_state_indices,
        plan.boundary_recovery_lens, kernels.NULL_BLOCK_ID, slots.stride(0), T)
    kernels.kda_recoverssm_commit(layer["pool"], layer["records"], layer["A_log"], layer["dt_bias"], LOWER_BOUND,
                                  slots, plan, record_indices=rows)


def main(steps: int) -> None:
    g = torch.Generator().manual_seed(0)
    layers = [layer_buffers(g) for _ in range(LAYERS)]
    slot_table = i32([[1, 7], [2, 7], [3, 7], [-1, 7]])  # the engine's slot column is a strided view
    slots, rows = slot_table[:, 0], i32([0, 1, 2, -1])
    for step in range(steps):
        deferred = step % 3 != 2
        lens = [T, 1 + (step + 1) % T, T, 0]
        qsl = i32([0, *torch.tensor(lens).cumsum(0).tolist()])
        outs = []
        for layer in layers:
            flush(layer, slots, rows)
            q, k, raw_g = (torch.randn(1, sum(lens), H, K, generator=g).to(torch.bfloat16).to(DEVICE)
                           for _ in range(3))
            v = torch.randn(1, sum(lens), H, V, generator=g).to(torch.bfloat16).to(DEVICE)
            beta = torch.randn(1, sum(lens), H, generator=g).to(torch.bfloat16).to(DEVICE)
            outs.append(engine.kda_recoverssm_verify(q, k, v, raw_g, beta, layer["A_log"], layer["dt_bias"],
                                                     LOWER_BOUND, layer["pool"], layer["records"], qsl, slots, T,
                                                     record_indices=rows))
        accepted = i32([max(1, n - step % 2) for n in lens[:3]] + [0])
        eager = torch.tensor([step % 2 == 0, False, False, False], device=DEVICE)
        for layer in layers:
            kernels.kda_recoverssm_plan(layer["plan"], accepted, qsl, slots, T)
            if deferred:
                engine._defer_commit_kernel[(BATCH,)](slots, layer["plan"].commit_lens, rows, layer["pending"],
                                                      eager, kernels.NULL_BLOCK_ID, slots.stride(0))
            kernels.kda_recoverssm_commit(layer["pool"], layer["records"], layer["A_log"], layer["dt_bias"],
                                          LOWER_BOUND, slots, layer["plan"], record_indices=rows)
        sums = " ".join(f"{float(layer['pool'].double().sum()):.12e}" for layer in layers)
        print(f"step {step} {'deferred' if deferred else 'stock'}: out {float(outs[0].double().sum()):.12e} "
              f"states {sums} pending {layers[0]['pending'].tolist()}")
    for layer in layers:
        flush(layer, slots, rows)
    print("final " + " ".join(f"{float(layer['pool'].double().sum()):.12e}" for layer in layers))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
