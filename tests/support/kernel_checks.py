"""The kernels' results against the float64 reference's: outputs, records, plans and states
within the rounding of their dtypes, and nothing outside what a batch or a plan names changed
by a single bit; the deferred steps' buffers beside a problem's."""

from __future__ import annotations

import random

import torch

import kernels
import kernels.reference as ref
from kernels.buffers import CommitPlan
from tests.support.kernel_problems import Problem, float64_records, rel_rmse, same_bits, within_rounding


# One rounding of a bf16 downcast: half an ulp (2^-8 relative) when compiled, which rounds
# to nearest even; a whole ulp under the Triton interpreter, which truncates downcasts.
BF16_ROUNDING = 2.0 ** -8 if torch.cuda.is_available() else 2.0 ** -7
FP32_RMSE = 1e-5


def output_matches(actual: torch.Tensor, expected: torch.Tensor, state_rounded: bool) -> bool:
    """``state_rounded``: the kernel's bf16 state already holds roundings the reference lacks."""
    if state_rounded:
        return rel_rmse(actual, expected) <= 1e-2
    if actual.dtype == torch.float32:
        return rel_rmse(actual, expected) <= FP32_RMSE
    return within_rounding(actual, expected, BF16_ROUNDING)


def state_matches(actual: torch.Tensor, expected: torch.Tensor, rounds: int = 1) -> bool:
    if actual.dtype == torch.float32:
        return rel_rmse(actual, expected) <= FP32_RMSE
    if rounds == 1:
        return within_rounding(actual, expected, BF16_ROUNDING)
    return rel_rmse(actual, expected) <= 1e-2  # bf16 roundings of earlier rounds propagate


def check_verify(p: Problem, state, records, state64, records64, rounds: int = 1) -> None:
    """Run verify through both implementations and compare everything it writes."""
    before_state = state.clone()
    before_records = records.correction.clone(), records.key_gate.clone()
    out = p.verify(kernels, state, records)
    out64 = p.verify(ref, state64, records64, acts_dtype=torch.float64)
    assert same_bits(state, before_state), "verify wrote the checkpoint"
    check_window_results(p, out, out64, records, records64, before_records, rounds)


def check_window_results(p: Problem, out, out64, records, records64, before_records, rounds: int) -> None:
    """Outputs and records of one window against the reference's; key/gate records must be
    bit copies of the inputs, and nothing may be written outside the row windows: the
    corrections there keep their bits (``before_records``: correction and key/gate before)."""
    before_corr, before_kg = before_records
    written = ~torch.isnan(out64)
    assert torch.equal(~torch.isnan(out), written), "outputs written outside the row windows"
    state_rounded = rounds > 1 and p.state.dtype == torch.bfloat16
    assert output_matches(out[written], out64[written], state_rounded)

    corr_written = ~torch.isnan(records64.correction)
    assert torch.equal(~torch.isnan(records.correction), corr_written)
    assert same_bits(records.correction[~corr_written], before_corr[~corr_written]), \
        "a correction outside the row windows changed"
    assert rel_rmse(records.correction[corr_written], records64.correction[corr_written]) <= (
        1e-2 if state_rounded else FP32_RMSE)

    expected_kg = before_kg.clone()
    rows = p.record_rows().tolist()
    qsl = p.query_start_loc.tolist()
    for b, slot in enumerate(p.state_indices.tolist()):
        if slot <= 0:
            continue
        for t in range(qsl[b + 1] - qsl[b]):
            tok = qsl[b] + t
            expected_kg[rows[b], :, t] = torch.cat([p.k[0, tok], p.raw_g[0, tok]], dim=-1)
    assert same_bits(records.key_gate, expected_kg), "key/gate records are not bit copies of the inputs"


PLAN_COLUMNS = ("commit_lens", "final_state_indices", "boundary_state_indices", "boundary_recovery_lens")


def check_plans(plan: CommitPlan, plan64: CommitPlan, B: int) -> None:
    """Every column of the two plans is equal in its first ``B`` rows."""
    for name in PLAN_COLUMNS:
        assert torch.equal(getattr(plan, name)[:B], getattr(plan64, name)[:B]), name


def plan_both(p: Problem, plan: CommitPlan, plan64: CommitPlan, accepted: torch.Tensor, **align) -> None:
    kernels.kda_recoverssm_plan(plan, accepted, p.query_start_loc, p.state_indices, p.T, **align)
    ref.kda_recoverssm_plan(plan64, accepted, p.query_start_loc, p.state_indices, p.T, **align)
    check_plans(plan, plan64, p.batch)


def check_states(p: Problem, state, state64, before, rounds: int) -> None:
    """Slots that should hold a state match the reference; every NaN slot is untouched."""
    live = ~torch.isnan(state64).any(dim=(1, 2, 3))
    assert state_matches(state[live], state64[live], rounds)
    assert same_bits(state[~live], before[~live]), "a slot outside the plan changed"


def random_accepted(p: Problem, gen: random.Random) -> torch.Tensor:
    """Every accept length 0..T on the full-window rows 0..T of ``standard_rows`` (row 0 takes
    T, so that it always has something to fold; the others 0..T-1 in a random order), random
    ones (some out of range) on the other rows."""
    full = list(range(p.T))
    gen.shuffle(full)
    others = [gen.randint(-2, p.T + 3) for _ in range(p.batch - p.T - 1)]
    return torch.tensor([p.T, *full, *others], dtype=torch.int32, device=p.state.device)


def deferred_buffers(p, rows, device):
    """The float64 state and records beside ``p``'s, and pending counts and plans for the
    kernels and the reference: counts 0 at the batch's record rows, -7 at rows no request owns."""
    pending = torch.full((p.records.num_rows,), -7, dtype=torch.int32, device=device)
    pending[rows] = 0
    plan, plan64 = CommitPlan.allocate(p.batch, device), CommitPlan.allocate(p.batch, device)
    return p.state.double(), float64_records(p.records), pending, pending.clone(), plan, plan64
