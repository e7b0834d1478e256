"""kda's documented raw kernels against the seed's (``tests/support/seed_surface.py``, written apart
from the same contract): every buffer bit for bit, duplicate record rows in one batch
included; and every synthesised trace replays through an engine module holding the
seed's kernels."""

import random

import pytest
import torch

from kernels import NULL_BLOCK_ID, CommitPlan
from tests.support import documented_surface as kda
from tests.support import seed_surface as seed
from tests.support.seeds import fresh_seed
from tests.support.trace_helpers import make_trace, run_kda
from traces.synth.config import SynthConfig

SENTINEL = -7
PLAN_COLUMNS = ("commit_lens", "final_state_indices", "boundary_state_indices", "boundary_recovery_lens")


def batch_rows(gen: random.Random, B: int, R: int, T: int, device, duplicate_live_rows: bool):
    """A strided slot column (null and padding slots among them), record rows (some -1, some
    repeated), counts in ``[-3, T + 3]`` (``SENTINEL`` where no row points), planned lengths,
    eager flags. Without ``duplicate_live_rows`` a repeated record row is live in one batch
    row at most (two live rows deferring into one count race on any GPU, the seed's too)."""
    table = torch.full((B, 3), 99, dtype=torch.int32)
    table[:, 0] = torch.tensor([gen.choice([NULL_BLOCK_ID, -1]) if gen.random() < 0.3 else gen.randint(1, 40)
                                for _ in range(B)], dtype=torch.int32)
    rows = [-1 if gen.random() < 0.15 else gen.randrange(R) for _ in range(B)]
    if not duplicate_live_rows:
        owner: dict[int, int] = {}
        for b, r in enumerate(rows):
            if r >= 0 and int(table[b, 0]) > NULL_BLOCK_ID:
                if r in owner:
                    table[b, 0] = NULL_BLOCK_ID
                owner.setdefault(r, b)
    pending = torch.full((R,), SENTINEL, dtype=torch.int32)
    for r in rows:
        if r >= 0:
            pending[r] = gen.randint(-3, T + 3)
    lens = torch.tensor([gen.randint(0, T) for _ in range(B)], dtype=torch.int32)
    eager = torch.tensor([gen.random() < 0.3 for _ in range(B)])
    on = lambda t: t.to(device)  # noqa: E731
    return on(table)[:, 0], on(torch.tensor(rows, dtype=torch.int32)), on(pending), on(lens), on(eager)


def sentinel_plan(B: int, device) -> CommitPlan:
    plan = CommitPlan.allocate(B + 2, device)
    for name in PLAN_COLUMNS:
        getattr(plan, name).fill_(SENTINEL)
    return plan


def launch_defer(module, slots, lens, rows, pending, eager) -> None:
    module._defer_commit_kernel[(slots.shape[0],)](slots, lens, rows, pending, eager, NULL_BLOCK_ID, slots.stride(0))


def launch_flush_plan(module, slots, rows, pending, plan: CommitPlan, T: int) -> None:
    module._prepare_flush_plan_kernel[(slots.shape[0],)](
        slots, rows, pending, plan.commit_lens, plan.final_state_indices, plan.boundary_state_indices,
        plan.boundary_recovery_lens, NULL_BLOCK_ID, slots.stride(0), T)


@pytest.mark.gpu
@pytest.mark.parametrize("with_eager", [False, True], ids=["no-eager", "eager"])
@pytest.mark.parametrize("B, R, T", [(1, 2, 4), (12, 8, 4), (17, 9, 8)])
def test_raw_kernels_match_the_seed_bit_for_bit(device, with_eager, B, R, T):
    """Defer then flush plan, two rounds, kda's kernels and the seed's from the same buffers:
    counts, planned lengths and every plan column (rows past the batch too) identical; the
    flush plan with live rows sharing a record row as well."""
    gen = random.Random(fresh_seed())
    slots, rows, pending, lens, eager = batch_rows(gen, B, R, T, device, duplicate_live_rows=False)
    eager = eager if with_eager else None
    buffers = {name: (pending.clone(), None) for name in ("kda", "seed")}
    for round_ in range(2):
        seen = {}
        for name, module in (("kda", kda), ("seed", seed)):
            counts = buffers[name][0]
            planned = lens.clone()
            launch_defer(module, slots, planned, rows, counts, eager)
            plan = sentinel_plan(B, device)
            launch_flush_plan(module, slots, rows, counts, plan, T)
            seen[name] = (counts.clone(), planned, [getattr(plan, c).clone() for c in PLAN_COLUMNS])
        (kc, kl, kp), (sc, sl, sp) = seen["kda"], seen["seed"]
        assert torch.equal(kc, sc), f"round {round_}: pending differs"
        assert torch.equal(kl, sl), f"round {round_}: commit_lens after defer differs"
        for column, k, s in zip(PLAN_COLUMNS, kp, sp):
            assert torch.equal(k, s), f"round {round_}: flush plan {column} differs"
        assert int((kl == 0).sum()) > 0 or B == 1
        lens = torch.tensor([gen.randint(0, T) for _ in range(B)], dtype=torch.int32, device=device)

    slots, rows, pending, _, _ = batch_rows(gen, B, R, T, device, duplicate_live_rows=True)
    before = pending.clone()
    plans = []
    for module in (kda, seed):
        plan = sentinel_plan(B, device)
        launch_flush_plan(module, slots, rows, pending, plan, T)
        plans.append([getattr(plan, c) for c in PLAN_COLUMNS])
    assert torch.equal(pending, before), "a flush plan kernel wrote pending"
    for column, k, s in zip(PLAN_COLUMNS, *plans):
        assert torch.equal(k, s), f"duplicate rows: flush plan {column} differs"


@pytest.mark.parametrize("mode", ["stock", "deferred", "mixed"])
def test_synthesised_traces_replay_through_the_seed_kernels(mode, tmp_path, capsys, monkeypatch):
    """A module with the seed's two raw kernels replays synthesised traces with exit 0."""
    seed_value = fresh_seed() % 1000
    path = make_trace(tmp_path / f"{mode}.safetensors",
                      SynthConfig(preset="tiny", mode=mode, requests=6, seed=seed_value, max_batch=4,
                                  max_decode_steps=3, num_slots=5))
    code, out, err = run_kda(["replay", str(path), "--impl", "tests/support/seed_surface.py", "--no-progress"],
                             capsys, monkeypatch)
    assert code == 0, f"synth --seed {seed_value}: {out}{err}"
    assert "flush (_prepare_flush_plan_kernel)" in \
        out.split("ops through: tests/support/seed_surface.py: ")[1].split(";")[0] or mode == "stock"
