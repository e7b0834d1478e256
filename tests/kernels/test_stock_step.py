"""The stock step (verify, plan, commit) against the float64 reference, on fresh random
inputs every run: two rounds under every pairing of the ops' designs, and Kimi-K3's shapes."""

from __future__ import annotations

import random

import pytest
import torch

import kernels
import kernels.reference as ref
from kernels.buffers import CommitPlan
from tests.support.forced_designs import use_designs
from tests.support.kernel_checks import check_states, check_verify, plan_both, random_accepted
from tests.support.kernel_problems import float64_records, make_problem, standard_rows
from tests.support.seeds import fresh_seed

pytestmark = pytest.mark.gpu


# Kimi-K3's head dims compiled; under the interpreter, which runs programs one after another,
# half of them: still two blocks of key channels a program, at a quarter of the work
WIDE = 128 if torch.cuda.is_available() else 64

CONFIGS = [
    # id, H, K, V, T, activation, state, lower_bound, record_indices, large gates
    # (float32 activations at Kimi-K3's head dims compiled only; the interpreter runs them on the
    # small shapes below)
    pytest.param(2, WIDE, WIDE, 8, torch.float32, torch.float32, -5.0, True, False, id=f"k{WIDE}-T8-fp32-lb",
                 marks=pytest.mark.gpu_only),
    pytest.param(2, 32, 32, 4, torch.float32, torch.float32, None, False, True, id="k32-T4-fp32-softplus"),
    pytest.param(2, WIDE, WIDE, 8, torch.bfloat16, torch.float32, -5.0, True, False, id=f"k{WIDE}-T8-bf16-lb"),
    pytest.param(2, 32, 48, 4, torch.bfloat16, torch.bfloat16, None, True, True, id="v48-T4-bf16state"),
    pytest.param(1, 16, 16, 1, torch.float32, torch.bfloat16, -5.0, False, False, id="k16-T1-bf16state"),
    # key channels that do not fill the last column block, and an odd window
    pytest.param(2, 48, 32, 3, torch.float32, torch.float32, -5.0, True, False, id="k48-T3-partial-block"),
]


# the stock round trip pairs every design of each op with one of the other's
STOCK_DESIGNS = [("token-loop", "token-loop"), ("two-kernels", "fold-operand-once"),
                 ("one-pass", "fold-in-tile"), ("two-kernels", "fold-operand-once-wide")]


@pytest.mark.parametrize("designs", STOCK_DESIGNS, ids=["-".join(d) for d in STOCK_DESIGNS])
@pytest.mark.parametrize("H,K,V,T,act,state_dtype,lower_bound,with_rec,large", CONFIGS)
def test_stock_two_rounds_match_reference(device, monkeypatch, designs, H, K, V, T, act, state_dtype,
                                         lower_bound, with_rec, large):
    use_designs(monkeypatch, verify=designs[0], commit=designs[1])
    seed = fresh_seed()
    gen = random.Random(seed)
    p = make_problem(device, H=H, K=K, V=V, T=T, act=act, state_dtype=state_dtype,
                     lower_bound=lower_bound, seed=seed, with_record_indices=with_rec, large_gates=large)
    state, records = p.state, p.records
    state64, records64 = p.state.double(), float64_records(p.records)
    plan, plan64 = CommitPlan.allocate(p.batch + 3, device), CommitPlan.allocate(p.batch + 3, device)
    for rounds in (1, 2):
        before = state.clone()
        check_verify(p, state, records, state64, records64, rounds)
        plan_both(p, plan, plan64, random_accepted(p, gen))
        kernels.kda_recoverssm_commit(state, records, p.A_log, p.dt_bias, lower_bound, p.state_indices,
                                      plan, record_indices=p.record_indices)
        ref.kda_recoverssm_commit(state64, records64, p.A_log, p.dt_bias, lower_bound, p.state_indices,
                                  plan64, record_indices=p.record_indices)
        check_states(p, state, state64, before, rounds)
        # next round: fresh tokens for the same requests
        fresh = make_problem(device, H=H, K=K, V=V, T=T, act=act, state_dtype=state_dtype,
                             lower_bound=lower_bound, seed=seed + rounds, with_record_indices=with_rec,
                             large_gates=large)
        p.q, p.k, p.v, p.raw_g, p.raw_beta = fresh.activations()


@pytest.mark.gpu_only
@pytest.mark.parametrize("T", [8, 4])
def test_kimi_k3_shapes(device, verify_design, T):
    """H=12, K=V=128, B=256 with every kind of row, fp32 state, bf16 activations."""
    seed = fresh_seed()
    gen = random.Random(seed)
    lengths, kinds = standard_rows(T)
    reps = 256 // len(lengths)
    lengths = (lengths * (reps + 1))[:256]
    kinds = (kinds * (reps + 1))[:256]
    p = make_problem(device, H=12, K=128, V=128, T=T, act=torch.bfloat16, state_dtype=torch.float32,
                     lower_bound=-5.0, seed=seed, lengths=lengths, kinds=kinds)
    state64, records64 = p.state.double(), float64_records(p.records)
    before = p.state.clone()
    check_verify(p, p.state, p.records, state64, records64)
    plan, plan64 = CommitPlan.allocate(256, device), CommitPlan.allocate(256, device)
    accepted = torch.tensor([gen.randint(0, T) for _ in range(256)], dtype=torch.int32, device=device)
    plan_both(p, plan, plan64, accepted)
    kernels.kda_recoverssm_commit(p.state, p.records, p.A_log, p.dt_bias, -5.0, p.state_indices, plan,
                                  record_indices=p.record_indices)
    ref.kda_recoverssm_commit(state64, records64, p.A_log, p.dt_bias, -5.0, p.state_indices, plan64,
                              record_indices=p.record_indices)
    check_states(p, p.state, state64, before, 1)
