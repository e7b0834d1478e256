"""Plan and defer against the float64 reference: the stock and align-mode plan rules, the
defer rules, the fused plan and defer, and the flush plan, over batches wider than a program."""

from __future__ import annotations

import pytest
import torch

import kernels
import kernels.plan
import kernels.reference as ref
from kernels.buffers import CommitPlan
from tests.support.kernel_checks import PLAN_COLUMNS
from tests.support.seeds import fresh_seed

pytestmark = pytest.mark.gpu


def test_defer_rules(device):
    """Rows without a slot or record row leave pending alone; eager rows keep their plan."""
    slots = torch.tensor([5, 0, -1, 7, 9], dtype=torch.int32, device=device)
    rows = torch.tensor([3, 1, 2, -1, 0], dtype=torch.int32, device=device)
    eager = torch.tensor([False, False, False, False, True], device=device)
    for impl in (kernels, ref):
        plan = CommitPlan.allocate(5, device)
        plan.commit_lens.copy_(torch.tensor([4, 2, 3, 1, 6], dtype=torch.int32))
        pending = torch.tensor([9, 9, 9, 9], dtype=torch.int32, device=device)
        impl.kda_recoverssm_defer(plan, slots, rows, pending, eager)
        assert pending.tolist() == [0, 9, 9, 4]
        assert plan.commit_lens.tolist() == [0, 2, 3, 1, 6]
        plan.commit_lens.copy_(torch.tensor([4, 2, 3, 1, 6], dtype=torch.int32))
        pending.fill_(9)
        impl.kda_recoverssm_defer(plan, slots, rows, pending)  # no eager tensor: nobody is eager
        assert pending.tolist() == [6, 9, 9, 4]
        assert plan.commit_lens.tolist() == [0, 2, 3, 1, 0]


def test_defer_and_flush_plan_span_several_programs(device):
    """A batch wider than one program of the integer kernels: pending counts, commit lengths
    and the flush plan match the reference row for row."""
    gen = torch.Generator().manual_seed(fresh_seed())
    B, R, T = 300, 320, 8
    slots = torch.randint(-1, 40, (B,), generator=gen, dtype=torch.int32).to(device)  # -1 and 0 are null
    rows = torch.randperm(R, generator=gen)[:B].to(torch.int32)
    rows[torch.rand(B, generator=gen) < 0.1] = -1
    rows = rows.to(device)
    eager = (torch.rand(B, generator=gen) < 0.2).to(device)
    lens = torch.randint(0, T + 1, (B,), generator=gen, dtype=torch.int32)
    pending_before = torch.randint(-2, T + 3, (R,), generator=gen, dtype=torch.int32)
    seen = []
    for impl, prepare_flush_plan in ((kernels, kernels.plan.prepare_flush_plan), (ref, ref._prepare_flush_plan)):
        plan = CommitPlan.allocate(B, device)
        plan.commit_lens.copy_(lens)
        pending = pending_before.clone().to(device)
        impl.kda_recoverssm_defer(plan, slots, rows, pending, eager)
        deferred = (pending.tolist(), plan.commit_lens.tolist())
        flush_plan = CommitPlan.allocate(B, device)
        prepare_flush_plan(flush_plan, slots, rows, pending, T, True)
        seen.append((deferred, pending.tolist(), [getattr(flush_plan, name).tolist() for name in PLAN_COLUMNS]))
    assert seen[0] == seen[1]
    assert seen[0][0][0] != pending_before.tolist(), "defer changed no pending count"


@pytest.mark.parametrize("align", [False, True], ids=["in-place", "align"])
@pytest.mark.parametrize("with_eager", [False, True], ids=["no-eager", "eager"])
def test_plan_deferred_is_plan_then_defer(device, align, with_eager):
    """One launch of ``kda_recoverssm_plan_deferred`` against the reference's plan then defer,
    over more rows than one program: every plan column and pending count equal, the plan's
    rows past the batch untouched."""
    gen = torch.Generator().manual_seed(fresh_seed())
    B, R, T, bs, width = 300, 320, 4, 8, 4
    qsl = torch.cat([torch.zeros(1, dtype=torch.int32),
                     torch.randint(0, T + 1, (B,), generator=gen, dtype=torch.int32).cumsum(0).to(torch.int32)])
    slots = torch.randint(-1, 40, (B,), generator=gen, dtype=torch.int32)  # -1 and 0 are null
    accepted = torch.randint(-1, T + 2, (B,), generator=gen, dtype=torch.int32)
    rows = torch.randperm(R, generator=gen)[:B].to(torch.int32)
    rows[torch.rand(B, generator=gen) < 0.1] = -1
    eager = (torch.rand(B, generator=gen) < 0.2) if with_eager else None
    pending_before = torch.randint(-2, T + 3, (R,), generator=gen, dtype=torch.int32)
    table = torch.randint(1, 60, (B, width), generator=gen, dtype=torch.int32)
    computed = torch.randint(0, bs * (width - 1), (B,), generator=gen, dtype=torch.int32)
    on = {name: t.to(device) if t is not None else None for name, t in dict(
        qsl=qsl, slots=slots, accepted=accepted, rows=rows, eager=eager, table=table, computed=computed).items()}
    aligned = dict(block_table=on["table"], num_computed=on["computed"], block_size=bs) if align else {}
    seen = []
    for fused in (True, False):
        plan = CommitPlan.allocate(B + 2, device)
        for column in (plan.commit_lens, plan.final_state_indices, plan.boundary_state_indices,
                       plan.boundary_recovery_lens):
            column.fill_(77)
        pending = pending_before.clone().to(device)
        args = (on["accepted"], on["qsl"], on["slots"], T)
        if fused:
            kernels.kda_recoverssm_plan_deferred(plan, *args, on["rows"], pending, on["eager"], **aligned)
        else:
            ref.kda_recoverssm_plan(plan, *args, **aligned)
            ref.kda_recoverssm_defer(plan, on["slots"], on["rows"], pending, on["eager"])
        seen.append([column.tolist() for column in (plan.commit_lens, plan.final_state_indices,
                                                    plan.boundary_state_indices, plan.boundary_recovery_lens,
                                                    pending)])
    assert seen[0] == seen[1]
    assert all(column[B:] == [77, 77] for column in seen[0][:4]), "the plan was written past the batch"
    assert seen[0][4] != pending_before.tolist(), "nothing was deferred"
    assert any(n > 0 for n in seen[0][0][:B]), "nothing stays planned"


def test_stock_plan_rules(device):
    T = 4
    qsl = torch.tensor([0, 4, 8, 10, 10, 14, 18], dtype=torch.int32, device=device)
    slots = torch.tensor([3, 4, 5, 6, 0, -1], dtype=torch.int32, device=device)
    accepted = torch.tensor([2, 9, 3, 4, 4, 4], dtype=torch.int32, device=device)
    for impl in (kernels, ref):
        plan = CommitPlan.allocate(8, device)
        plan.boundary_state_indices.fill_(77)
        impl.kda_recoverssm_plan(plan, accepted, qsl, slots, T)
        assert plan.commit_lens[:6].tolist() == [2, 4, 2, 0, 0, 0]
        assert plan.final_state_indices[:6].tolist() == [3, 4, 5, 0, 0, 0]
        assert plan.boundary_state_indices[:6].tolist() == [0] * 6
        assert plan.boundary_recovery_lens[:6].tolist() == [0] * 6
        assert plan.boundary_state_indices[6:].tolist() == [77, 77], "plan wrote past the batch"


def test_align_plan_block_boundaries(device):
    """bs = 8, T = 4: windows that stay inside a block, end exactly on a boundary, cross one."""
    T, bs = 4, 8
    qsl = torch.tensor([0, 4, 8, 12, 16, 20], dtype=torch.int32, device=device)
    slots = torch.tensor([11, 21, 31, 41, 51], dtype=torch.int32, device=device)
    table = torch.tensor([[11, 12, 13], [21, 22, 23], [31, 32, 33], [41, 42, 43], [51, 52, 53]],
                         dtype=torch.int32, device=device)
    computed = torch.tensor([1, 5, 6, 8, 22], dtype=torch.int32, device=device)
    accepted = torch.tensor([3, 3, 4, 0, 2], dtype=torch.int32, device=device)
    # row 0: 1+3=4 inside block 0.  row 1: 5+3=8 ends exactly on the boundary (old c_end//bs
    # formula would pick column 1).  row 2: 6+4=10 crosses into block 1.  row 3: nothing accepted.
    # row 4: 22+2=24 ends on a boundary past the table width: final clamps to the last column.
    for impl in (kernels, ref):
        plan = CommitPlan.allocate(5, device)
        impl.kda_recoverssm_plan(plan, accepted, qsl, slots, T, block_table=table, num_computed=computed,
                                 block_size=bs)
        assert plan.commit_lens.tolist() == [3, 3, 4, 0, 2]
        assert plan.final_state_indices.tolist() == [11, 21, 32, 0, 53]
        assert plan.boundary_state_indices.tolist() == [0, 21, 31, 0, 53]
        assert plan.boundary_recovery_lens.tolist() == [0, 3, 2, 0, 2]
