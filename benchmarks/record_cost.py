"""What recording costs at Kimi-K3 shapes (H=12, K=V=128, T=8, fp32 state, bf16 records):
the write detection's fingerprints per event, and a recorded decode step against the same
step unrecorded.

    python3 benchmarks/record_cost.py [--batch 1,8,64,256] [--json PATH]

Prints, per batch: the time to fingerprint the batch's state slots and record rows (what a
recorded verify pays twice, before and after the call), and the median wall time of one
stock decode step (verify, plan, commit) through the kernels and through a recorder writing
its shards to a temporary folder. Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

H, K, V, T = 12, 128, 128, 8


def _median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", default="1,8,64,256")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import kernels
    from traces.record.recorder import record_trace
    from traces.record.watch import fingerprint

    dev = "cuda"
    rows = []
    for B in (int(b) for b in args.batch.split(",")):
        g = torch.Generator(device=dev).manual_seed(B)
        pool = torch.randn(B + 1, H, V, K, device=dev, generator=g)
        records = kernels.allocate_records(B, H, T, K, V, torch.bfloat16, dev)
        plan = kernels.CommitPlan.allocate(B, dev)
        A_log = torch.zeros(H, device=dev)
        dt_bias = torch.zeros(H * K, device=dev)
        slots = torch.arange(1, B + 1, dtype=torch.int32, device=dev)
        qsl = torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device=dev)
        x = [torch.randn(1, B * T, H, K, device=dev, generator=g).to(torch.bfloat16) for _ in range(4)]
        beta = torch.randn(1, B * T, H, device=dev, generator=g).to(torch.bfloat16)
        accepted = torch.full((B,), T // 2, dtype=torch.int32, device=dev)
        index = slots.long()

        def prints():
            fingerprint(pool[index])
            fingerprint(records.correction)
            fingerprint(records.key_gate)

        def step(api):
            api.kda_recoverssm_verify(x[0], x[1], x[2], x[3], beta, A_log, dt_bias, -5.0, pool, records, qsl, slots, T)
            api.kda_recoverssm_plan(plan, accepted, qsl, slots, T)
            api.kda_recoverssm_commit(pool, records, A_log, dt_bias, -5.0, slots, plan)

        step(kernels)
        plain = _median_ms(lambda: step(kernels), 20)
        fp = _median_ms(prints, 20)
        with tempfile.TemporaryDirectory() as tmp:
            with record_trace(Path(tmp) / "cost.safetensors", kernels) as api:
                step(api)
                recorded = _median_ms(lambda: step(api), 10)
                kept = api.recording.watch.nbytes()  # the fingerprints and copies it keeps
                shard_bytes = api.recording.bytes / max(api.events, 1)
        rows.append({"batch": B, "fingerprint_ms": fp, "step_ms": plain, "recorded_step_ms": recorded,
                     "watch_bytes": kept, "shard_bytes_per_event": shard_bytes})
        print(f"B={B:4d}  fingerprints of the batch's slots and rows {fp:7.3f} ms  "
              f"step {plain:7.3f} ms  recorded step {recorded:8.2f} ms  "
              f"kept for detection {kept / 1024:8.1f} KiB  shards {shard_bytes / 2**20:7.2f} MiB/event")
    if args.json:
        Path(args.json).write_text(json.dumps({"shape": {"H": H, "K": K, "V": V, "T": T}, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
