"""The fused flush and verify against the reference's flush, then verify, under every design;
captured in CUDA graphs that share a memory pool, replayed in any order."""

from __future__ import annotations

import random

import pytest
import torch

import kernels
import kernels.dependent_launch as dependent_launch_module
import kernels.launch
import kernels.reference as ref
from kernels.dependent_launch import row_counters
from tests.support.forced_designs import use_designs
from tests.support.kernel_checks import (
    PLAN_COLUMNS,
    check_plans,
    check_states,
    check_window_results,
    deferred_buffers,
    plan_both,
    random_accepted,
)
from tests.support.kernel_problems import make_problem
from tests.support.seeds import fresh_seed

pytestmark = pytest.mark.gpu


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
