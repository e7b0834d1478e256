"""The commit against the float64 reference: align mode's final and boundary slots, and the
arguments the commit, plan and defer refuse."""

from __future__ import annotations

import pytest
import torch

import kernels
import kernels.reference as ref
from kernels.buffers import CommitPlan, KDARecoverSSMRecords
from tests.support.kernel_checks import FP32_RMSE, plan_both
from tests.support.kernel_problems import float64_records, make_problem, rel_rmse, same_bits
from tests.support.seeds import fresh_seed

pytestmark = pytest.mark.gpu


def test_align_commit_writes_final_and_boundary(device, commit_design):
    seed = fresh_seed()
    T, bs = 4, 4
    p = make_problem(device, H=2, K=32, V=32, T=T, act=torch.float32, state_dtype=torch.float32,
                     lower_bound=-5.0, seed=seed, lengths=[4, 4, 4], kinds=[1, 1, 1])
    n_slots = p.state.shape[0]
    free = [s for s in range(1, n_slots) if s not in p.state_indices.tolist()]
    table = torch.tensor([[int(p.state_indices[b]), free[2 * b], free[2 * b + 1]] for b in range(3)],
                         dtype=torch.int32, device=device)
    computed = torch.tensor([2, 2, 1], dtype=torch.int32, device=device)
    accepted = torch.tensor([2, 4, 1], dtype=torch.int32, device=device)  # ends on, crosses, inside
    state64, records64 = p.state.double(), float64_records(p.records)
    p.verify(kernels, p.state, p.records)
    p.verify(ref, state64, records64, acts_dtype=torch.float64)
    plan, plan64 = CommitPlan.allocate(3, device), CommitPlan.allocate(3, device)
    align = dict(block_table=table, num_computed=computed, block_size=bs)
    plan_both(p, plan, plan64, accepted, **align)
    assert plan.boundary_recovery_lens.tolist() == [2, 2, 0]
    before = p.state.clone()
    kernels.kda_recoverssm_commit(p.state, p.records, p.A_log, p.dt_bias, -5.0, p.state_indices, plan,
                                  record_indices=p.record_indices)
    ref.kda_recoverssm_commit(state64, records64, p.A_log, p.dt_bias, -5.0, p.state_indices, plan64,
                              record_indices=p.record_indices)
    written = [int(s) for s in plan.final_state_indices.tolist() + plan.boundary_state_indices.tolist() if s > 0]
    assert int(plan.final_state_indices[1]) == free[2] and int(plan.boundary_state_indices[1]) == table[1, 0]
    for s in written:
        assert rel_rmse(p.state[s], state64[s]) <= FP32_RMSE
    untouched = [s for s in range(n_slots) if s not in written]
    assert same_bits(p.state[untouched], before[untouched])


def test_commit_and_plan_reject_bad_arguments(device):
    p = make_problem(device, H=1, K=16, V=16, T=2, act=torch.float32, state_dtype=torch.float32,
                     lower_bound=-5.0, seed=4)
    small = CommitPlan.allocate(1, device)
    with pytest.raises(ValueError, match="plan.commit_lens: holds 1 rows"):
        kernels.kda_recoverssm_commit(p.state, p.records, p.A_log, p.dt_bias, -5.0, p.state_indices, small)
    plan = CommitPlan.allocate(p.batch, device)
    integer_kg = KDARecoverSSMRecords(p.records.correction, p.records.key_gate.to(torch.int16))
    with pytest.raises(ValueError, match="records.key_gate: unsupported activation dtype torch.int16"):
        kernels.kda_recoverssm_commit(p.state, integer_kg, p.A_log, p.dt_bias, -5.0, p.state_indices, plan)
    with pytest.raises(ValueError, match="num_accepted: expected int32"):
        kernels.kda_recoverssm_plan(plan, torch.zeros(p.batch, device=device), p.query_start_loc,
                                    p.state_indices, p.T)
    with pytest.raises(ValueError, match="block_table: align mode needs"):
        kernels.kda_recoverssm_plan(plan, torch.zeros(p.batch, dtype=torch.int32, device=device),
                                    p.query_start_loc, p.state_indices, p.T, block_size=8)
    with pytest.raises(ValueError, match="eager: expected"):
        kernels.kda_recoverssm_defer(plan, p.state_indices, p.record_rows(),
                                     torch.zeros(p.records.num_rows, dtype=torch.int32, device=device),
                                     eager=torch.zeros(1, device=device))
