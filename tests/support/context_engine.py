"""A serving engine's decode loop over three KDA layers with conv state, unedited for recording:
every kernel call and the commit context come from the engine's module (``--module``,
default ``tests.support.context_surface``) through its attributes.

Requests arrive and finish; a slot freed by one is reused by the next after a prefill (a
fresh state and conv state written with torch, outside the kernels). Each step's rows are
the live requests in random order, then padding rows (slot -1 or the null slot 0). Each
layer's step writes its conv state (each real slot's history but its oldest entry, then the
step's ``T`` new inputs; docs/design.md §10), then verifies with ``record_indices =
state_indices`` (records per slot). The step then commits every layer through one
``KDARecoverSSMCommitContext`` (``create`` once, ``commit`` per step, accepted counts read
through shuffled ``request_indices`` among ``B + 2`` requests); with ``--no-context`` it
plans once and commits each layer through the kernel API instead. Prints a checksum of
every layer's state and conv state after each step.

Usage: python3 tests/support/context_engine.py [--steps N] [--layout dim_first|token_first]
       [--module NAME] [--no-context]
"""

from __future__ import annotations

import argparse
import importlib
import random
from dataclasses import dataclass

import torch

H, K, V, T = 2, 16, 16, 4
LAYERS, SLOTS, BATCH = 3, 6, 4
CONV_DIM, CONV_WIDTH = 8, 3
ACT = torch.bfloat16
LOWER_BOUND = -5.0
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@dataclass
class Layer:
    """A KDA layer as the engine holds it (what a commit context reads)."""

    kv_cache: tuple
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    local_num_heads: int = H
    head_dim: int = K
    gate_lower_bound: float | None = LOWER_BOUND


def new_layer(api, g: torch.Generator, dim_first: bool) -> Layer:
    entries = CONV_WIDTH - 1 + T - 1
    pool = (torch.randn(SLOTS, H, V, K, generator=g) * 0.5).to(DEVICE)
    pool[0] = 0
    conv = torch.randn(SLOTS, CONV_DIM, entries, generator=g).to(ACT).to(DEVICE)
    conv[0] = 0
    if not dim_first:
        conv = conv.transpose(1, 2).contiguous()
    records = api.allocate_records(SLOTS, H, T, K, V, ACT, DEVICE)
    return Layer((conv, pool, records.correction, records.key_gate),
                 torch.log(torch.empty(H).uniform_(1.0, 16.0, generator=g)).to(DEVICE),
                 (torch.randn(H * K, generator=g) * 0.5).to(DEVICE))


def conv_view(layer: Layer, dim_first: bool) -> torch.Tensor:
    """The layer's conv state as ``[N, dim, S]``."""
    conv = layer.kv_cache[0]
    return conv if dim_first else conv.transpose(1, 2)


def main(steps: int, dim_first: bool, module: str, use_context: bool) -> None:
    api = importlib.import_module(module)
    g = torch.Generator().manual_seed(0)
    rng = random.Random(0)
    layers = [new_layer(api, g, dim_first) for _ in range(LAYERS)]
    context = api.KDARecoverSSMCommitContext.create(layers, spec_query_len=T, max_num_reqs=BATCH,
                                                    conv_dim_first=dim_first) if use_context else None
    plan = None if use_context else api.CommitPlan.allocate(BATCH, DEVICE)

    def i32(values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=DEVICE)

    free, used, live = list(range(SLOTS - 1, 0, -1)), set(), {}
    for step in range(steps):
        while free and len(live) < BATCH - 1 and (not live or rng.random() < 0.5):
            slot = free.pop()  # the slot freed last first
            if slot in used:  # a reused slot: the prefill writes a fresh state and conv state
                for layer in layers:
                    layer.kv_cache[1][slot] = (torch.randn(H, V, K, generator=g) * 0.5).to(DEVICE)
                    conv_view(layer, dim_first)[slot] = torch.randn(CONV_DIM, CONV_WIDTH - 1 + T - 1,
                                                                    generator=g).to(ACT).to(DEVICE)
            used.add(slot)
            live[slot] = rng.randint(1, 3)
        order = rng.sample(sorted(live), len(live))
        pad = [rng.choice([-1, 0]) for _ in range(BATCH - len(order))]
        slots = i32(order + pad)
        lens = [rng.randint(1, T) for _ in order] + [rng.choice([0, 2]) if s == 0 else 0 for s in pad]
        qsl = i32([0, *torch.tensor(lens).cumsum(0).tolist()])
        total = sum(lens)
        for layer in layers:
            view = conv_view(layer, dim_first)
            for slot in order:  # the convolution update: the history but its oldest entry, then T new inputs
                new_inputs = torch.randn(CONV_DIM, T, generator=g).to(ACT).to(DEVICE)
                view[slot] = torch.cat([view[slot, :, 1:CONV_WIDTH - 1], new_inputs], dim=1)
            q, k, raw_g = (torch.randn(1, total, H, K, generator=g).to(ACT).to(DEVICE) for _ in range(3))
            v = torch.randn(1, total, H, V, generator=g).to(ACT).to(DEVICE)
            beta = torch.randn(1, total, H, generator=g).to(ACT).to(DEVICE)
            records = api.KDARecoverSSMRecords(layer.kv_cache[2], layer.kv_cache[3])
            api.kda_recoverssm_verify(q, k, v, raw_g, beta, layer.A_log, layer.dt_bias, LOWER_BOUND, layer.kv_cache[1],
                                      records, qsl, slots, T, record_indices=slots)
        accepted = i32([rng.randint(1, n) if n else 0 for n in lens])
        if use_context:
            requests = rng.sample(range(BATCH + 2), BATCH)
            per_request = [rng.randint(0, T) for _ in range(BATCH + 2)]
            for b, r in enumerate(requests):
                per_request[r] = int(accepted[b])
            context.commit(i32(per_request), slots, qsl, request_indices=i32(requests))
        else:
            api.kda_recoverssm_plan(plan, accepted, qsl, slots, T)
            for layer in layers:
                records = api.KDARecoverSSMRecords(layer.kv_cache[2], layer.kv_cache[3])
                api.kda_recoverssm_commit(layer.kv_cache[1], records, layer.A_log, layer.dt_bias, LOWER_BOUND, slots,
                                          plan, record_indices=slots)
        sums = " ".join(f"{float(x.kv_cache[1].double().sum()):.9e}/{float(x.kv_cache[0].double().sum()):.6e}"
                        for x in layers)
        print(f"step {step}: {sums}")
        for slot in list(live):
            live[slot] -= 1
            if live[slot] == 0:
                del live[slot]
                free.append(slot)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--layout", choices=("dim_first", "token_first"), default="dim_first")
    parser.add_argument("--module", default="tests.support.context_surface")
    parser.add_argument("--no-context", action="store_true")
    args = parser.parse_args()
    main(args.steps, args.layout == "dim_first", args.module, not args.no_context)
