"""``kernels.interpreter``: helper calls that skip re-patching compute what the interpreter
computes without the skip, bit for bit, and do skip it."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.interpreter import REPLACED, skip_repatching_in_helper_calls
from tests.support.kernel_problems import make_problem, same_bits
from tests.support.seeds import fresh_seed

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the Triton interpreter runs on the CPU only")


def _verify_and_commit(problem):
    """Verify a window, then commit its plan: every shared helper runs (gate, norm, step, fold)."""
    state, records = problem.state.clone(), kernels.KDARecoverSSMRecords(
        problem.records.correction.clone(), problem.records.key_gate.clone())
    out = problem.verify(kernels, state, records)
    accepted = torch.tensor([min(n, 2) for n in problem.lengths], dtype=torch.int32)
    plan = kernels.kda_recoverssm_plan(kernels.CommitPlan.allocate(problem.batch, "cpu"), accepted,
                                       problem.query_start_loc, problem.state_indices, problem.T)
    kernels.kda_recoverssm_commit(state, records, problem.A_log, problem.dt_bias, problem.lower_bound,
                                  problem.state_indices, plan, record_indices=problem.record_indices)
    return out, state, records.correction, records.key_gate


def _patching_calls(monkeypatch) -> list[str]:
    from triton.runtime import interpreter

    calls: list[str] = []
    patch_lang = interpreter._patch_lang
    monkeypatch.setattr(interpreter, "_patch_lang", lambda fn: calls.append(fn.__name__) or patch_lang(fn))
    return calls


def test_helper_calls_without_repatching_give_the_same_bits_and_patch_once_a_launch(monkeypatch):
    assert skip_repatching_in_helper_calls()  # installed by conftest under triton 3.6; idempotent
    problem = make_problem("cpu", H=2, K=16, V=16, T=3, act=torch.bfloat16, state_dtype=torch.float32,
                           lower_bound=-5.0, seed=fresh_seed())
    with monkeypatch.context() as m:
        skipped_calls = _patching_calls(m)
        skipping = _verify_and_commit(problem)
    with monkeypatch.context() as m:
        for (cls, name), original in REPLACED.items():
            m.setattr(cls, name, original)
        all_calls = _patching_calls(m)
        patching = _verify_and_commit(problem)
    for a, b in zip(skipping, patching):
        assert same_bits(a, b)
    assert torch.isfinite(skipping[0][:, :sum(problem.lengths)]).all()
    assert len(all_calls) > 20 * len(skipped_calls) > 0  # every helper call patched, against a few per launch
