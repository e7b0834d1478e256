"""The flush against the float64 reference: the flush apart's fold of pending records, and
deferred steps (flush, verify, plan, defer, commit) ending in a flush that consumes every
pending count."""

from __future__ import annotations

import random

import pytest
import torch

import kernels
import kernels.reference as ref
from kernels.commit import fold_pending
from tests.support.kernel_checks import check_states, check_verify, deferred_buffers, plan_both, random_accepted
from tests.support.kernel_problems import Problem, make_problem, same_bits
from tests.support.seeds import fresh_seed

pytestmark = pytest.mark.gpu


def deferred_problem(device, seed: int) -> Problem:
    """The deferred tests' problem: H=2, K=V=32, T=4, bf16 activations, fp32 state."""
    return make_problem(device, H=2, K=32, V=32, T=4, act=torch.bfloat16, state_dtype=torch.float32,
                        lower_bound=-5.0, seed=seed)


def test_fold_pending_folds_without_consuming(device):
    """The flush apart's first launch (``fold_pending``): each row's pending records folded
    into its slot in place as the reference's flush folds them, counts out of range clamped,
    slots of rows with nothing to fold untouched; the counts and the plan left as they were."""
    seed = fresh_seed()
    gen = random.Random(seed)
    T = 4
    p = deferred_problem(device, seed)
    rows = p.record_rows()
    state64, records64, pending, pending64, plan, plan64 = deferred_buffers(p, rows, device)
    check_verify(p, p.state, p.records, state64, records64)  # the records to fold
    # up to each row's recorded tokens; past T (clamped) on full windows
    counts = torch.tensor([gen.randint(-2, T + 3 if n == T else n) for n in p.lengths], dtype=torch.int32,
                          device=device)
    counts[0] = T  # a full window
    pending[rows] = pending64[rows] = counts
    before, counts_before, plan_before = p.state.clone(), pending.clone(), plan.commit_lens.clone()
    fold_pending(p.state, p.records, p.A_log, p.dt_bias, -5.0, p.state_indices, rows, pending)
    ref.kda_recoverssm_flush(state64, records64, p.A_log, p.dt_bias, -5.0, p.state_indices, rows, pending64, plan64)
    check_states(p, p.state, state64, before, 1)
    assert torch.equal(pending, counts_before), "fold_pending consumed a count"
    assert same_bits(plan.commit_lens, plan_before), "fold_pending wrote a plan"


@pytest.mark.parametrize("with_eager", [True, False])
def test_deferred_two_rounds_match_reference(device, commit_design, with_eager):
    """flush, verify, plan, defer (+ commit of eager rows), twice, then a final flush."""
    seed = fresh_seed()
    gen = random.Random(seed)
    T = 4
    p = deferred_problem(device, seed)
    rows = p.record_rows()
    state, records = p.state, p.records
    state64, records64, pending, pending64, plan, plan64 = deferred_buffers(p, rows, device)
    eager = None
    if with_eager:
        eager = torch.tensor([b % 3 == 1 for b in range(p.batch)], device=device)
    for rounds in (1, 2):
        before = state.clone()
        kernels.kda_recoverssm_flush(state, records, p.A_log, p.dt_bias, p.lower_bound, p.state_indices,
                                     rows, pending, plan)
        ref.kda_recoverssm_flush(state64, records64, p.A_log, p.dt_bias, p.lower_bound, p.state_indices,
                                 rows, pending64, plan64)
        assert torch.equal(pending, pending64)
        assert torch.equal(plan.commit_lens, plan64.commit_lens)
        check_states(p, state, state64, before, rounds)

        check_verify(p, state, records, state64, records64)
        accepted = random_accepted(p, gen)  # row 0 (a full window, never eager) defers T
        plan_both(p, plan, plan64, accepted)
        kernels.kda_recoverssm_defer(plan, p.state_indices, rows, pending, eager)
        ref.kda_recoverssm_defer(plan64, p.state_indices, rows, pending64, eager)
        assert torch.equal(pending, pending64), "pending counts differ after defer"
        assert torch.equal(plan.commit_lens, plan64.commit_lens), "commit_lens differ after defer"
        kernels.kda_recoverssm_commit(state, records, p.A_log, p.dt_bias, p.lower_bound, p.state_indices,
                                      plan, record_indices=rows)
        ref.kda_recoverssm_commit(state64, records64, p.A_log, p.dt_bias, p.lower_bound, p.state_indices,
                                  plan64, record_indices=rows)
        check_states(p, state, state64, before, rounds)
        fresh = deferred_problem(device, seed + rounds)
        p.q, p.k, p.v, p.raw_g, p.raw_beta = fresh.activations()

    deferred = pending.clone()
    before = state.clone()
    kernels.kda_recoverssm_flush(state, records, p.A_log, p.dt_bias, p.lower_bound, p.state_indices, rows,
                                 pending, plan)
    ref.kda_recoverssm_flush(state64, records64, p.A_log, p.dt_bias, p.lower_bound, p.state_indices, rows,
                             pending64, plan64)
    assert bool((deferred[rows] > 0).any()), "the test deferred nothing"
    assert int(pending[rows].abs().sum()) == 0, "flush did not consume every pending count"
    assert bool((pending[pending != 0] == -7).all()), "flush touched a pending count no row names"
    check_states(p, state, state64, before, 2)

    # a second flush has nothing left to fold: the state must not move
    settled = state.clone()
    kernels.kda_recoverssm_flush(state, records, p.A_log, p.dt_bias, p.lower_bound, p.state_indices, rows,
                                 pending, plan)
    assert same_bits(state, settled), "flushing twice folded the window twice"
