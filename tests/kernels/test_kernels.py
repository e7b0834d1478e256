"""Triton kernels against the float64 reference, on fresh random inputs every run.

Runs compiled on CUDA when present (``pytest -m gpu``) and through the Triton interpreter
otherwise. Every test checks values: outputs, records, plans, pending counts and states,
and that nothing outside what a plan names changes by a single bit.
"""

from __future__ import annotations

import random

import pytest
import torch

import kernels
import kernels.launch
import kernels.plan
import kernels.reference as ref
from kernels.buffers import CommitPlan, KDARecoverSSMRecords
from kernels.capability import is_hopper_or_later
from kernels.commit import fold_pending
import kernels.dependent_launch as dependent_launch_module
from kernels.dependent_launch import dependent_launch, row_counters
from tests.support.kernel_problems import (
    Problem,
    float64_records,
    make_problem,
    rel_rmse,
    same_bits,
    standard_rows,
    within_rounding,
)
from tests.support.seeds import fresh_seed
from traces import bench

pytestmark = pytest.mark.gpu

# One rounding of a bf16 downcast: half an ulp (2^-8 relative) when compiled, which rounds
# to nearest even; a whole ulp under the Triton interpreter, which truncates downcasts.
BF16_ROUNDING = 2.0 ** -8 if torch.cuda.is_available() else 2.0 ** -7
FP32_RMSE = 1e-5


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


def use_designs(monkeypatch, **designs: str) -> None:
    """Run every call of each op through the design named for it, whatever the batch
    (``KDA_DESIGN``, ``kernels.launch``): ``use_designs(monkeypatch, verify="one-pass")``; an
    op's name with ``_`` for ``-``."""
    forced = ",".join(f"{op.replace('_', '-')}={design}" for op, design in designs.items())
    monkeypatch.setenv(kernels.launch.DESIGN_ENV, forced)
    assert kernels.launch.forced_designs() == {op.replace("_", "-"): design for op, design in designs.items()}


@pytest.fixture(params=kernels.launch.DESIGNS["commit"])
def commit_design(request, monkeypatch):
    use_designs(monkeypatch, commit=request.param)
    return request.param


@pytest.fixture(params=kernels.launch.DESIGNS["verify"])
def verify_design(request, monkeypatch):
    use_designs(monkeypatch, verify=request.param)
    return request.param


def test_design_table_follows_pair_count():
    """K3 per TP8 rank (H=12) on the H200 the table is tuned on. Verify: one token at a time up
    to B=8 at T=4 and B=4 at T=8, one kernel up to B=16, two from B=17. Flushing: up to B=2
    the flush apart; one token at a time up to B=8 at T=4 and B=4 at T=8, else two kernels.
    Commit: one token at a time up to B=32 at T=4 and B=8 at T=8 (never past B=32),
    then the fold operand in every V-tile up to B=10, once from B=11, 64 key channels a
    program from B=43."""
    def designs(op_config, batches, T, **kw):
        return [op_config(b, 12, 128, 128, T, **kw).design for b in batches]

    verify, commit = kernels.launch.verify_config, kernels.launch.commit_config
    assert designs(verify, (8, 9, 16, 17, 85, 86), 4) == [
        "token-loop", "one-pass", "one-pass", "two-kernels", "two-kernels", "two-kernels"]
    assert designs(verify, (4, 5), 8) == ["token-loop", "one-pass"]
    assert designs(verify, (1, 2, 3, 8, 9), 4, flush=True) == [
        "flush-apart", "flush-apart", "token-loop-token-by-token", "token-loop-token-by-token", "two-kernels"]
    assert designs(verify, (1, 2, 3, 4, 5), 8, flush=True) == [
        "flush-apart", "flush-apart", "token-loop-token-by-token", "token-loop-token-by-token", "two-kernels"]
    assert designs(commit, (32, 33), 4) == ["token-loop", "fold-operand-once"]
    assert designs(commit, (8, 9, 10, 11, 42, 43), 8) == [
        "token-loop", "fold-in-tile", "fold-in-tile", "fold-operand-once", "fold-operand-once",
        "fold-operand-once-wide"]
    assert designs(commit, (33,), 1) == ["fold-operand-once"]
    # the same pairs per SM on a GPU of half the SMs: half the batch
    half = kernels.launch.Target(compiled=True, sm_count=66)
    assert designs(verify, (4, 5, 8, 9), 4, target=half) == ["token-loop", "one-pass", "one-pass", "two-kernels"]


def test_design_tiles():
    """State rows per program: the stock token loop 4 at T=4, at T=8 2 up to B=2, then 8 (the
    flush apart's too, to B=2); the flushing one 8 at T=4, 4 at T=8; under the
    interpreter (programs one after another) 32 and 16. The commit's token loop 4 up to
    B=4, 8 up to B=8, then 16 (32 under the interpreter). The flushing two kernels on 32-row
    one-warp tiles."""
    verify, commit = kernels.launch.verify_config, kernels.launch.commit_config
    interpreter = kernels.launch.INTERPRETER
    assert verify(8, 12, 128, 128, 4).block_v == 4
    assert [verify(b, 12, 128, 128, 8).block_v for b in (1, 2, 3, 4)] == [2, 2, 8, 8]
    assert [verify(b, 12, 128, 128, 4, flush=True).block_v for b in (2, 3, 8)] == [4, 8, 8]
    assert [verify(b, 12, 128, 128, 8, flush=True).block_v for b in (2, 3, 4)] == [2, 4, 4]
    assert [verify(b, 12, 128, 128, 4, flush=True).window_at_once for b in (2, 3)] == [True, False]
    assert verify(1, 12, 128, 128, 8, target=interpreter).block_v == 32
    assert {verify(b, 12, 128, 128, 4, flush=True, target=interpreter).block_v for b in (1, 2, 3)} == {16}
    assert [commit(b, 12, 128, 128, 4).block_v for b in (1, 4, 5, 8, 9, 32)] == [4, 4, 8, 8, 16, 16]
    assert commit(1, 12, 128, 128, 4, target=interpreter).block_v == 32
    for flushing in (verify(5, 12, 128, 128, 8, flush=True), verify(9, 12, 128, 128, 4, flush=True)):
        assert (flushing.design, flushing.block_v, flushing.num_warps) == ("two-kernels", 32, 1)


def test_token_loops_take_a_register_budget():
    """Every token loop runs under a budget of 168 registers but the flushing verify on 8 state
    rows up to 64 pairs and the commit on 4 rows from 25 pairs and on 16 past 192."""
    verify, commit = kernels.launch.verify_config, kernels.launch.commit_config
    assert {verify(b, 12, 128, 128, t).max_registers for b, t in ((1, 4), (2, 4), (8, 4), (1, 8), (4, 8))} == {168}
    assert [verify(b, 12, 128, 128, 4, flush=True).max_registers for b in (1, 2, 3, 5, 6, 8)] == [
        168, 168, None, None, 168, 168]
    assert {verify(b, 12, 128, 128, 8, flush=True).max_registers for b in (2, 4)} == {168}
    budgets = [commit(b, 12, 128, 128, 4).max_registers for b in (1, 2, 3, 4, 5, 8, 9, 16, 17, 32)]
    assert budgets == [168, 168, None, None, 168, 168, 168, 168, None, None]


@pytest.mark.parametrize("value, message", [
    ("verify=fast", "unknown verify design 'fast'"), ("prefill=one-pass", "unknown op 'prefill'")])
def test_a_bad_forced_design_is_named(monkeypatch, value, message):
    monkeypatch.setenv(kernels.launch.DESIGN_ENV, value)
    with pytest.raises(ValueError, match=message):
        kernels.launch.verify_config(1, 1, 16, 16, 1)


def test_a_design_is_chosen_once_per_shape_target_and_setting(monkeypatch):
    """Repeated calls of one shape on one target walk the table once; another ``KDA_DESIGN``
    value is parsed and chosen again, and the first value's choice is still kept."""
    launch = kernels.launch
    walked = []
    counted = tuple(launch.Rule(rule.design, lambda key, rule=rule: walked.append(rule.design) or rule.holds(key),
                                rule.why) for rule in launch._RULES["verify"])
    monkeypatch.setitem(launch._RULES, "verify", counted)
    monkeypatch.delenv(launch.DESIGN_ENV, raising=False)
    launch._chosen_design.cache_clear()
    launch._parse_designs.cache_clear()
    shape = (8, 12, 128, 128, 4)
    assert [launch.verify_config(*shape).design for _ in range(3)] == ["token-loop"] * 3
    assert walked == ["token-loop"]
    assert launch._chosen_design.cache_info()[:2] == (2, 1)  # hits, misses
    assert launch.verify_config(*shape, target=launch.INTERPRETER).design == "token-loop"
    assert walked == ["token-loop"] * 2  # another target, chosen again
    monkeypatch.setenv(launch.DESIGN_ENV, "verify=two-kernels")
    assert [launch.verify_config(*shape).design for _ in range(2)] == ["two-kernels"] * 2
    assert launch._parse_designs.cache_info().misses == 2  # "" and "verify=two-kernels", once each
    monkeypatch.delenv(launch.DESIGN_ENV)
    assert launch.verify_config(*shape).design == "token-loop"
    assert walked == ["token-loop"] * 2
    assert launch._chosen_design.cache_info()[:2] == (4, 3)


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


def test_a_gate_whose_sigmoid_overflows_decays_exactly_and_warns_of_nothing(device):
    """A * (raw_g + dt_bias) far below zero: the interpreter's exp overflows to inf inside the
    sigmoid (numpy's RuntimeWarning, which the tests' set-up hides as harmless), the log
    decay is 0 as the reference's is, and verify's results are the reference's."""
    import warnings

    p = make_problem(device, H=1, K=16, V=16, T=2, act=torch.float32, state_dtype=torch.float32, lower_bound=-5.0,
                     seed=fresh_seed(), with_record_indices=False, lengths=[2], kinds=[1])
    p.raw_g = torch.full_like(p.raw_g, -20.0)  # A = 16: exp(-A * x) = exp(320), past float32's range
    p.A_log = torch.full_like(p.A_log, 16.0).log()
    with warnings.catch_warnings(record=True) as seen:
        check_verify(p, p.state, p.records, p.state.double(), float64_records(p.records))
    assert not [w for w in seen if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in seen]


def deferred_buffers(p, rows, device):
    """The float64 state and records beside ``p``'s, and pending counts and plans for the
    kernels and the reference: counts 0 at the batch's record rows, -7 at rows no request owns."""
    pending = torch.full((p.records.num_rows,), -7, dtype=torch.int32, device=device)
    pending[rows] = 0
    plan, plan64 = CommitPlan.allocate(p.batch, device), CommitPlan.allocate(p.batch, device)
    return p.state.double(), float64_records(p.records), pending, pending.clone(), plan, plan64


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


FLUSHING_CASES = [
    pytest.param(design, dtype, 4, -5.0, id=f"{design}-{name}")
    for design in kernels.launch.DESIGNS["flush-verify"]
    for dtype, name in ((torch.float32, "fp32-state"), (torch.bfloat16, "bf16-state"))
    if design != "flush-apart" or dtype == torch.float32  # apart: two tested kernels in turn
] + [  # K3's window, and gates without a lower bound (the unfactored window)
    pytest.param(design, torch.float32, 8, None, id=f"{design}-T8-no-lower-bound")
    for design in ("flush-apart", "token-loop-token-by-token", "two-kernels")
] + [  # a long window token by token: the 2-row tiles of the fewest pairs (compiled)
    pytest.param("token-loop-token-by-token", torch.float32, 8, -5.0, id="token-loop-token-by-token-T8",
                 marks=pytest.mark.gpu_only)]


@pytest.mark.parametrize("design, state_dtype, T, lower_bound", FLUSHING_CASES)
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_flush_verify_matches_flush_then_verify(device, state_dtype, design, T, lower_bound, monkeypatch):
    """The fused flush and verify against the reference's flush, then verify: three deferred
    steps (flush-verify, plan, defer), every accept length, null and padding rows, a row
    whose pending records are folded although it has no tokens, NaN in every slot and
    record row the batch does not name; two blocks of key channels. Scratch buffers start
    as infinities: a product that reads a lane no kernel wrote meets inf - inf and fails the
    test under the interpreter (numpy's invalid-value warning, made an error here)."""
    allocate = torch.empty

    def poisoned(*args, **kwargs):
        t = allocate(*args, **kwargs)
        return t.fill_(float("inf")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", poisoned)
    use_designs(monkeypatch, flush_verify=design)
    seed = fresh_seed()
    gen = random.Random(seed)
    p = make_problem(device, H=2, K=64, V=32, T=T, act=torch.bfloat16, state_dtype=state_dtype,
                     lower_bound=lower_bound, seed=seed)
    rows = p.record_rows()
    state, records = p.state, p.records
    state64, records64, pending, pending64, plan, plan64 = deferred_buffers(p, rows, device)
    empty_row = p.lengths.index(0)  # a real slot with no tokens (standard_rows)
    folded = 0
    for rounds in (1, 2, 3):
        if rounds == 3:  # the no-token row takes over row 0's records and pending count
            pending[rows[empty_row]] = pending64[rows[empty_row]] = pending[rows[0]]
            for recs in (records, records64):
                recs.correction[rows[empty_row]] = recs.correction[rows[0]]
                recs.key_gate[rows[empty_row]] = recs.key_gate[rows[0]]
        before, before_records = state.clone(), (records.correction.clone(), records.key_gate.clone())
        folded += int(pending[rows].clamp(min=0).sum())
        acts = p.activations()
        out = kernels.kda_recoverssm_flush_verify(
            *acts, p.A_log, p.dt_bias, p.lower_bound, state, records, p.query_start_loc, p.state_indices, T,
            rows, pending, plan, out=torch.full_like(p.v, float("nan")))
        out64 = ref.kda_recoverssm_flush_verify(
            *p.activations(torch.float64), p.A_log, p.dt_bias, p.lower_bound, state64, records64,
            p.query_start_loc, p.state_indices, T, rows, pending64, plan64,
            out=torch.full(p.v.shape, float("nan"), dtype=torch.float64, device=device))
        assert torch.equal(pending, pending64), "pending counts differ after the flush"
        check_plans(plan, plan64, p.batch)
        check_states(p, state, state64, before, rounds)
        check_window_results(p, out, out64, records, records64, before_records, rounds)

        accepted = random_accepted(p, gen)  # row 0 (a full window) defers T
        plan_both(p, plan, plan64, accepted)
        kernels.kda_recoverssm_defer(plan, p.state_indices, rows, pending)
        ref.kda_recoverssm_defer(plan64, p.state_indices, rows, pending64)
        assert torch.equal(pending, pending64), "pending counts differ after defer"
        fresh = make_problem(device, H=2, K=64, V=32, T=T, act=torch.bfloat16, state_dtype=state_dtype,
                             lower_bound=-5.0, seed=seed + rounds)
        p.q, p.k, p.v, p.raw_g, p.raw_beta = fresh.activations()
    assert folded > 0, "the test folded nothing"
    assert int(row_counters(torch.device(device), 1).abs().sum()) == 0, "a counter was left set"


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


def test_zero_tokens_leave_out_untouched(device):
    """A batch without tokens: verify returns the ``out`` it was given and writes nothing."""
    p = make_problem(device, H=1, K=16, V=16, T=2, act=torch.float32, state_dtype=torch.float32,
                     lower_bound=None, seed=1, lengths=[0, 0], kinds=[1, -1])
    buffers = (p.state, p.records.correction, p.records.key_gate)
    before = [t.clone() for t in buffers]
    empty = lambda x: x[:, :0]  # noqa: E731
    out = torch.full((1, 0, 1, 16), 3.0, device=device)
    result = kernels.kda_recoverssm_verify(empty(p.q), empty(p.k), empty(p.v), empty(p.raw_g), empty(p.raw_beta),
                                           p.A_log, p.dt_bias, None, p.state, p.records,
                                           torch.zeros(3, dtype=torch.int32, device=device), p.state_indices, 2,
                                           out=out, record_indices=p.record_indices)
    assert result is out
    assert all(same_bits(t, b) for t, b in zip(buffers, before)), "a batch without tokens wrote a buffer"


def _verify_kwargs(p: Problem) -> dict:
    q, k, v, g, beta = p.activations()
    return dict(q=q, k=k, v=v, raw_g=g, raw_beta=beta, A_log=p.A_log, dt_bias=p.dt_bias, lower_bound=-5.0,
                checkpoint_state=p.state, records=p.records, query_start_loc=p.query_start_loc,
                state_indices=p.state_indices, spec_query_len=p.T, out=None, record_indices=p.record_indices)


BAD_VERIFY_ARGS = [
    ("q", lambda a: a["q"][..., :8], "q: expected shape"),
    ("k dtype", lambda a: a["k"].half(), "q: expected torch.float16 like k"),
    ("v heads", lambda a: a["v"].transpose(2, 3).contiguous().transpose(2, 3), "v: heads must be contiguous"),
    ("raw_beta", lambda a: a["raw_beta"][..., None], "raw_beta: expected shape"),
    ("A_log", lambda a: a["A_log"].double(), "A_log: expected a float32 tensor"),
    ("dt_bias", lambda a: a["dt_bias"][:-1], "dt_bias: expected"),
    ("checkpoint_state", lambda a: a["checkpoint_state"].half(), "checkpoint_state: expected float32 or bfloat16"),
    ("query_start_loc", lambda a: a["query_start_loc"].long(), "query_start_loc: expected int32"),
    ("state_indices", lambda a: a["state_indices"][:-1], "state_indices: expected"),
    ("record_indices", lambda a: a["record_indices"][:-1], "record_indices: expected"),
    ("spec_query_len", lambda a: 3, "records.correction: expected"),
    ("out", lambda a: torch.empty_like(a["v"], dtype=torch.float64), "out: expected torch.float32"),
]


@pytest.mark.parametrize("name,mutate,message", BAD_VERIFY_ARGS, ids=[b[0] for b in BAD_VERIFY_ARGS])
def test_verify_rejects_bad_arguments(device, name, mutate, message):
    p = make_problem(device, H=2, K=16, V=16, T=2, act=torch.float32, state_dtype=torch.float32,
                     lower_bound=-5.0, seed=2)
    args = _verify_kwargs(p)
    key = name.split()[0]
    if key == "k":
        args["k"] = mutate(args)
        args["records"] = kernels.allocate_records(p.records.num_rows, 2, 2, 16, 16, torch.float16, device)
    else:
        args[key] = mutate(args)
    for impl in (kernels, ref):
        with pytest.raises(ValueError, match=message.replace("[", r"\[")):
            impl.kda_recoverssm_verify(**args)


def test_verify_rejects_too_many_tokens(device):
    p = make_problem(device, H=1, K=16, V=16, T=2, act=torch.float32, state_dtype=torch.float32,
                     lower_bound=-5.0, seed=3, lengths=[2], kinds=[1])
    args = _verify_kwargs(p)
    for name in ("q", "k", "v", "raw_g", "raw_beta"):
        args[name] = torch.cat([args[name]] * 2, dim=1)
    with pytest.raises(ValueError, match="q: T_tot = 4 exceeds B\\*T = 1\\*2"):
        kernels.kda_recoverssm_verify(**args)


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


def test_dependent_launch_only_on_cuda(monkeypatch):
    assert dependent_launch(torch.device("cpu")) == {"DEPENDENT": False, "launch_pdl": False}
    counters = row_counters(torch.device("cpu"), 300)
    assert counters.dtype == torch.int32 and counters.numel() >= 300 and int(counters.abs().sum()) == 0
    assert row_counters(torch.device("cpu"), 5) is counters  # kept, not reallocated
    if torch.cuda.is_available():
        monkeypatch.setenv("KDA_DEPENDENT_LAUNCH", "0")
        assert dependent_launch(torch.device("cuda")) == {"DEPENDENT": False, "launch_pdl": False}


def test_row_counters_are_kept_per_stream_never_from_a_capture(monkeypatch):
    """A stream's counter set is kept from an eager call and used again, inside a capture
    too; a capture on a stream without a set large enough gets a fresh zeroed one, not kept."""
    monkeypatch.setattr(dependent_launch_module, "_row_counters", {})
    cpu = torch.device("cpu")
    captured = row_counters(cpu, 300, capturing=True)
    assert captured.numel() >= 300 and int(captured.abs().sum()) == 0
    assert not dependent_launch_module._row_counters, "a set was kept from a capture"
    assert row_counters(cpu, 5, capturing=True) is not captured
    kept = row_counters(cpu, 300, capturing=False)
    assert kept is not captured and row_counters(cpu, 5) is kept
    assert row_counters(cpu, 300, capturing=True) is kept  # a warmed-up stream's set, in its captures
    larger = row_counters(cpu, 4 * kept.numel(), capturing=True)
    assert larger.numel() >= 4 * kept.numel() and row_counters(cpu, 5) is kept


def test_hopper_features_follow_the_device(monkeypatch):
    """Dependent launch: CUDA sm_90 and later only, whatever the device's index."""
    assert not is_hopper_or_later(torch.device("cpu"))
    if torch.cuda.is_available():
        hopper = torch.cuda.get_device_capability()[0] >= 9
        indexed = torch.device("cuda", torch.cuda.current_device())
        assert is_hopper_or_later(torch.device("cuda")) == is_hopper_or_later(indexed) == hopper
        monkeypatch.setenv("KDA_DEPENDENT_LAUNCH", "1")
        assert dependent_launch(indexed) == {"DEPENDENT": hopper, "launch_pdl": hopper}


def _decode_steps(batch: int, dependent: bool, capture: bool, monkeypatch, seed: int) -> list[torch.Tensor]:
    """Stock, deferred and stock steps over two layers of ``batch`` k3-tp8 rows (random accept
    lengths); returns everything they write. ``capture``: run them as one CUDA graph."""
    monkeypatch.setenv("KDA_DEPENDENT_LAUNCH", "1" if dependent else "0")
    preset = bench.PRESETS["k3-tp8"]
    counts = bench.accepted_counts("random", batch, preset.spec_len, seed)
    w = bench.Workload(kernels, preset, torch.float32, batch, preset.spec_len, counts, 2, "cuda", seed)

    def steps() -> None:
        for name in ("step-stock", "step-deferred", "step-stock"):
            w.run(name)

    if capture:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            steps()
        graph.replay()
    else:
        steps()
    torch.cuda.synchronize()
    return [w.pool, w.out, w.records.correction, w.records.key_gate, w.pending, w.plan_columns]


@pytest.mark.gpu_only
# B=3: token loops, the flushing one electing its last programs by counters; 16: one-pass verify,
# two-launch commit; 64 and 256: two launches each, over several waves of operand programs
@pytest.mark.parametrize("batch", [3, 16, 64, 256])
def test_dependent_launch_keeps_stream_order(monkeypatch, batch):
    """Kernels launched as dependents (each waits for the one ahead before touching memory)
    write exactly what plain stream order writes, eagerly and in a CUDA graph, and leave every
    row counter at zero."""
    if not is_hopper_or_later(torch.device("cuda")):
        pytest.skip("dependent launch needs compute capability 9.0")
    monkeypatch.setenv("KDA_DEPENDENT_LAUNCH", "1")
    assert dependent_launch(torch.device("cuda")) == {"DEPENDENT": True, "launch_pdl": True}
    seed = fresh_seed()
    ordered = _decode_steps(batch, False, False, monkeypatch, seed)
    eager = _decode_steps(batch, True, False, monkeypatch, seed)  # also compiles every kernel before capture
    graphed = _decode_steps(batch, True, True, monkeypatch, seed)
    assert torch.isfinite(ordered[0]).all() and ordered[1].abs().sum() > 0
    for plain, dep, graph in zip(ordered, eager, graphed):
        assert same_bits(dep, plain) and same_bits(graph, plain)
    counters = [c for (device, _), c in dependent_launch_module._row_counters.items() if device.startswith("cuda")]
    assert batch != 3 or counters  # the flushing token loop's, kept from the eager steps (a capture keeps none)
    assert all(int(c.abs().sum()) == 0 for c in counters)


class _PendingFlushVerify:
    """A flushing verify with records pending (after an eager deferred step on the current
    stream, which also compiles its kernels), its reference results, and what its buffers
    held before it: ``run`` launches it, ``restore`` puts the buffers back, ``check``
    compares them with the reference."""

    def __init__(self, device: str, seed: int, gen: random.Random):
        p = make_problem(device, H=2, K=64, V=32, T=8, act=torch.bfloat16, state_dtype=torch.float32,
                         lower_bound=-5.0, seed=seed)
        self.p, self.rows = p, p.record_rows()
        state64, records64, self.pending, pending64, self.plan, plan64 = deferred_buffers(p, self.rows, device)
        for impl, state, records, pending, plan, dtype in ((kernels, p.state, p.records, self.pending, self.plan, None),
                                                           (ref, state64, records64, pending64, plan64, torch.float64)):
            impl.kda_recoverssm_flush_verify(*p.activations(dtype), p.A_log, p.dt_bias, p.lower_bound, state, records,
                                             p.query_start_loc, p.state_indices, p.T, self.rows, pending, plan)
        plan_both(p, self.plan, plan64, random_accepted(p, gen))
        kernels.kda_recoverssm_defer(self.plan, p.state_indices, self.rows, self.pending)
        ref.kda_recoverssm_defer(plan64, p.state_indices, self.rows, pending64)
        assert int(self.pending[self.rows].clamp(min=0).sum()) > 0, "nothing pending to fold"
        fresh = make_problem(device, H=2, K=64, V=32, T=8, act=torch.bfloat16, state_dtype=torch.float32,
                             lower_bound=-5.0, seed=seed + 1)
        p.q, p.k, p.v, p.raw_g, p.raw_beta = fresh.activations()
        self.out = torch.full_like(p.v, float("nan"))
        self.buffers = (p.state, p.records.correction, p.records.key_gate, self.pending, self.out,
                        *(getattr(self.plan, name) for name in PLAN_COLUMNS))
        self.before = [t.clone() for t in self.buffers]
        self.out64 = ref.kda_recoverssm_flush_verify(
            *p.activations(torch.float64), p.A_log, p.dt_bias, p.lower_bound, state64, records64,
            p.query_start_loc, p.state_indices, p.T, self.rows, pending64, plan64,
            out=torch.full(p.v.shape, float("nan"), dtype=torch.float64, device=device))
        self.state64, self.records64, self.pending64, self.plan64 = state64, records64, pending64, plan64

    def run(self) -> None:
        p = self.p
        kernels.kda_recoverssm_flush_verify(*p.activations(), p.A_log, p.dt_bias, p.lower_bound, p.state, p.records,
                                            p.query_start_loc, p.state_indices, p.T, self.rows, self.pending,
                                            self.plan, out=self.out)

    def restore(self) -> None:
        for buffer, before in zip(self.buffers, self.before):
            buffer.copy_(before)

    def check(self) -> None:
        p = self.p
        assert torch.equal(self.pending, self.pending64), "pending counts not consumed as the reference's"
        check_plans(self.plan, self.plan64, p.batch)
        check_states(p, p.state, self.state64, self.before[0], 2)
        check_window_results(p, self.out, self.out64, p.records, self.records64, tuple(self.before[1:3]), 2)


@pytest.mark.gpu_only
def test_graphs_sharing_a_pool_replay_in_any_order(monkeypatch, device):
    """Two flushing verifies (token loops: counters elect each group's last program) captured
    as two CUDA graphs sharing one memory pool, on a stream that never ran one eagerly, so
    that each capture gets its own counters, zeroed inside its graph: replayed in either
    order, both give the reference's results (key records written, pending counts consumed),
    and no counter set is kept from the captures."""
    use_designs(monkeypatch, flush_verify="token-loop-token-by-token")
    # torch hands out streams from a pool: one an earlier test warmed up may come back
    monkeypatch.setattr(dependent_launch_module, "_row_counters", {})
    seed = fresh_seed()
    gen = random.Random(seed)
    flushes = [_PendingFlushVerify(device, seed + 2 * i, gen) for i in range(2)]
    capturing, pool = torch.cuda.Stream(), torch.cuda.graph_pool_handle()
    assert capturing != torch.cuda.current_stream()
    graphs = [torch.cuda.CUDAGraph() for _ in flushes]
    for graph, flush in zip(graphs, flushes):
        with torch.cuda.graph(graph, pool=pool, stream=capturing):
            flush.run()
    torch.cuda.synchronize()
    assert all(stream != capturing.cuda_stream for _, stream in dependent_launch_module._row_counters), \
        "a counter set was kept from a capture"
    for order in ((0, 1), (1, 0)):
        for flush in flushes:
            flush.restore()
        for i in order:
            graphs[i].replay()
        torch.cuda.synchronize()
        for flush in flushes:
            flush.check()
