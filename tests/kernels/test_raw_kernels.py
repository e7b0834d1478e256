"""The documented raw kernels, launched as an engine launches them: positional arguments,
grid ``(B,)``, one program per batch row; plans and pending counts checked exactly against
the reference, on rows with null and padding slots, record row -1, eager rows and pending
counts outside ``[0, T]``, two rounds in a row."""

import random

import pytest
import torch

import kernels
from kernels import NULL_BLOCK_ID, CommitPlan
from kernels import reference as ref
from tests.support.seeds import fresh_seed

pytestmark = pytest.mark.gpu

SENTINEL = -7


def engine_rows(device, gen: random.Random, B: int, T: int):
    """A strided ``state_indices`` column with null and padding slots, unique record rows
    (some -1) into ``B + 3`` pending counts from ``[-3, T + 3]`` (rows no request owns hold
    ``SENTINEL``), and planned commit lengths in ``[0, T]``."""
    slots = [gen.choice([NULL_BLOCK_ID, -1]) if gen.random() < 0.3 else 1 + b for b in range(B)]
    table = torch.full((B, 2), 99, dtype=torch.int32, device=device)
    table[:, 0] = torch.tensor(slots, dtype=torch.int32)
    owned = gen.sample(range(B + 3), B)
    record_rows = torch.tensor([-1 if gen.random() < 0.2 else r for r in owned], dtype=torch.int32, device=device)
    pending = torch.full((B + 3,), SENTINEL, dtype=torch.int32, device=device)
    for r in record_rows.tolist():
        if r >= 0:
            pending[r] = gen.randint(-3, T + 3)
    commit_lens = torch.tensor([gen.randint(0, T) for _ in range(B)], dtype=torch.int32, device=device)
    return table[:, 0], record_rows, pending, commit_lens


def launch_defer(state_indices, commit_lens, record_rows, pending, eager) -> None:
    kernels.defer_commit_kernel[(state_indices.shape[0],)](
        state_indices, commit_lens, record_rows, pending, eager, NULL_BLOCK_ID, state_indices.stride(0))


def launch_flush_plan(state_indices, record_rows, pending, plan: CommitPlan, T: int) -> None:
    kernels.prepare_flush_plan_kernel[(state_indices.shape[0],)](
        state_indices, record_rows, pending, plan.commit_lens, plan.final_state_indices,
        plan.boundary_state_indices, plan.boundary_recovery_lens, NULL_BLOCK_ID, state_indices.stride(0), T)


def sentinel_plan(B: int, device) -> CommitPlan:
    """A plan two rows longer than the batch, every column ``SENTINEL``."""
    plan = CommitPlan.allocate(B + 2, device)
    for column in (plan.commit_lens, plan.final_state_indices, plan.boundary_state_indices,
                   plan.boundary_recovery_lens):
        column.fill_(SENTINEL)
    return plan


def assert_same_plan(plan: CommitPlan, expected: CommitPlan) -> None:
    for name in ("commit_lens", "final_state_indices", "boundary_state_indices", "boundary_recovery_lens"):
        assert torch.equal(getattr(plan, name), getattr(expected, name)), f"{name} differs from the reference"


@pytest.mark.parametrize("with_eager", [False, True], ids=["no-eager", "eager"])
@pytest.mark.parametrize("B, T", [(1, 4), (9, 4), (13, 8)])
def test_documented_kernels_match_reference(device, with_eager, B, T):
    """Defer then flush, twice: the documented kernels against the reference."""
    gen = random.Random(fresh_seed())
    state_indices, record_rows, pending, commit_lens = engine_rows(device, gen, B, T)
    pending64 = pending.clone()
    eager = torch.tensor([gen.random() < 0.4 for _ in range(B)], device=device) if with_eager else None
    for _ in range(2):
        plan64 = sentinel_plan(B, device)
        plan64.commit_lens[:B] = commit_lens
        lens = plan64.commit_lens.clone()
        launch_defer(state_indices, lens, record_rows, pending, eager)
        ref.kda_recoverssm_defer(plan64, state_indices, record_rows, pending64, eager)
        assert torch.equal(lens, plan64.commit_lens), "commit_lens after defer differ"
        assert torch.equal(pending, pending64), "pending after defer differs"

        plan, plan64 = sentinel_plan(B, device), sentinel_plan(B, device)
        launch_flush_plan(state_indices, record_rows, pending, plan, T)
        ref._prepare_flush_plan(plan64, state_indices, record_rows, pending64, T, consume=False)
        assert_same_plan(plan, plan64)
        assert torch.equal(pending, pending64), "pending after the flush plan differs"
        commit_lens = torch.tensor([gen.randint(0, T) for _ in range(B)], dtype=torch.int32, device=device)
    unowned = torch.ones_like(pending, dtype=torch.bool)
    unowned[record_rows[record_rows >= 0].long()] = False
    assert bool((pending[unowned] == SENTINEL).all()), "a kernel touched a count no row names"


def test_documented_flush_plan_clamps_counts(device):
    """Counts below 0 plan nothing, above T plan T; null, padding and -1 rows plan nothing; no
    count changes (the documented kernel only reads ``pending``)."""
    T = 4
    state_indices = torch.tensor([3, 4, 5, NULL_BLOCK_ID, -1, 6], dtype=torch.int32, device=device)
    record_rows = torch.tensor([0, 1, 2, 3, 4, -1], dtype=torch.int32, device=device)
    pending = torch.tensor([-2, T + 5, 2, 3, 1, 9], dtype=torch.int32, device=device)
    plan = sentinel_plan(6, device)
    launch_flush_plan(state_indices, record_rows, pending, plan, T)
    assert plan.commit_lens.tolist() == [0, T, 2, 0, 0, 0, SENTINEL, SENTINEL]
    assert plan.final_state_indices[:6].tolist() == state_indices.tolist()
    assert plan.boundary_state_indices[:6].tolist() == [NULL_BLOCK_ID] * 6
    assert pending.tolist() == [-2, T + 5, 2, 3, 1, 9]


def test_kda_names_its_raw_kernels_publicly_and_an_engine_module_by_the_documented_names():
    """``kernels`` exports no underscore name; the example engine's module (as any engine
    module, docs/implementations.md) holds kda's raw kernels as ``_defer_commit_kernel`` and
    ``_prepare_flush_plan_kernel``."""
    from examples import recoverssm_module

    assert [name for name in kernels.__all__ if name.startswith("_")] == []
    assert recoverssm_module._defer_commit_kernel is kernels.defer_commit_kernel
    assert recoverssm_module._prepare_flush_plan_kernel is kernels.prepare_flush_plan_kernel
    assert {"_defer_commit_kernel", "_prepare_flush_plan_kernel"} <= set(recoverssm_module.__all__)
