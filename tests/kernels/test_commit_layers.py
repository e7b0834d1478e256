"""The engine's commit over several layers (``kernels.context.engine``) against its float64
reference (``kernels.context.reference``): plan, conv-state compaction and state commit.

Each batch has every kind of row: full windows taking every accept length 0..T, a partial
window, a null slot with tokens, CUDA-graph padding; in the first of two rounds the
accepted counts (and align mode's block table and computed counts) are read through a
shuffled ``request_indices``, in the second in row order. Every slot, record row and conv entry the batch does not name
holds NaN and must keep its bits; records are never written.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

import kernels.context.layers
import kernels.launch
from kernels import reference as ref
from kernels.buffers import CommitPlan, KDARecoverSSMRecords, allocate_records
from kernels.context.engine import CommitLayer, KDARecoverSSMCommitContext
from kernels.context.layers import LayerBuffers, LayerTables, kda_recoverssm_commit_layers
from kernels.context.reference import ReferenceCommitContext
from tests.support.kernel_problems import rel_rmse, same_bits, within_rounding
from tests.support.seeds import fresh_seed

pytestmark = pytest.mark.gpu

FP32_RMSE = 1e-5
BF16_ROUNDING = 2.0 ** -8 if torch.cuda.is_available() else 2.0 ** -7
NAN = float("nan")
TABLE_WIDTH = 3


@dataclass
class Batch:
    """One step's commit arguments and the rows' query lengths."""

    num_accepted: torch.Tensor
    state_indices: torch.Tensor
    query_start_loc: torch.Tensor
    request_indices: torch.Tensor | None
    lengths: list[int]
    align: dict

    def args(self) -> dict:
        return dict(num_accepted_tokens=self.num_accepted, state_indices=self.state_indices,
                    query_start_loc=self.query_start_loc, request_indices=self.request_indices, **self.align)


@dataclass
class Model:
    """Both twins of L layers' buffers: ``layers`` in the kernels' dtypes, ``layers64`` with
    float64 state and records (conv states, a copy of the same dtype)."""

    layers: list[CommitLayer]
    layers64: list[CommitLayer]
    gen: torch.Generator


def _layer(kv, A_log, dt_bias, H, K, lower_bound) -> CommitLayer:
    return CommitLayer(tuple(kv), A_log, dt_bias, H, K, lower_bound)


def as_int32(values, device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


def _nan_buffer(device, shape, dtype=torch.float32, misaligned: bool = False) -> torch.Tensor:
    """A NaN-filled tensor, or with ``misaligned`` a view one element into its storage (off a
    16-byte boundary)."""
    if not misaligned:
        return torch.full(shape, NAN, dtype=dtype, device=device)
    return torch.full((1 + torch.Size(shape).numel(),), NAN, dtype=dtype, device=device)[1:].view(shape)


def make_model(device, L, N, H, K, V, T, dim, history, state_dtype, conv_dim_first, lower_bound, seed,
               misaligned: bool = False) -> Model:
    gen = torch.Generator().manual_seed(seed)
    S = history + T - 1
    layers, layers64 = [], []
    for _ in range(L):
        state = _nan_buffer(device, (N, H, V, K), state_dtype, misaligned)
        correction = _nan_buffer(device, (N, H, T, V), misaligned=misaligned)
        key_gate = _nan_buffer(device, (N, H, T, 2 * K), torch.bfloat16, misaligned)
        conv = torch.full((N, dim, S) if conv_dim_first else (N, S, dim), NAN, dtype=torch.bfloat16)
        A_log = torch.rand(H, generator=gen).log().to(device)
        dt_bias = (torch.randn(H * K, generator=gen) * 0.5).to(device)
        kv = [conv.to(device), state, correction, key_gate]
        kv64 = [kv[0].clone(), kv[1].double(), kv[2].double(), kv[3].double()]
        layers.append(_layer(kv, A_log, dt_bias, H, K, lower_bound))
        layers64.append(_layer(kv64, A_log, dt_bias, H, K, lower_bound))
    return Model(layers, layers64, gen)


def fill_sources(model: Model, batch: Batch, T: int, fill_state: bool) -> None:
    """Random state (with ``fill_state``), conv window and records in each real row's source
    slot, the same in both twins; records past the row's tokens stay NaN."""
    for layer, layer64 in zip(model.layers, model.layers64):
        conv, state, correction, key_gate = layer.kv_cache
        for b, slot in enumerate(batch.state_indices.tolist()):
            if slot <= 0:
                continue
            n = batch.lengths[b]
            if fill_state:
                state[slot] = torch.randn(state.shape[1:], generator=model.gen).to(state)
            conv[slot] = torch.randn(conv.shape[1:], generator=model.gen).to(conv)
            correction[slot] = NAN
            key_gate[slot] = NAN
            correction[slot, :, :n] = torch.randn(correction[slot, :, :n].shape, generator=model.gen).to(correction)
            key_gate[slot, :, :n] = torch.randn(key_gate[slot, :, :n].shape, generator=model.gen).to(key_gate)
        for mine, twin in zip(layer.kv_cache, layer64.kv_cache):
            twin.copy_(mine)


def make_batch(device, T, slots: list[int], align_slots: list[list[int]] | None, block_size: int,
               rng: random.Random, by_request: bool) -> Batch:
    """Rows 0..T: full windows with accept lengths T, then 0..T-1 shuffled; a partial window;
    a null slot with tokens; two padding rows. ``slots`` gives the real rows' sources, in order.
    ``by_request``: per-request tensors in a shuffled order read through ``request_indices``,
    else in row order without it."""
    accepted = [T, *rng.sample(range(T), T), rng.randint(0, T + 2), T, 0, 0]
    lengths = [T] * (T + 1) + [max(1, T - 1), T, 0, 0]
    sources = [*slots[:T + 2], 0, -1, -1]
    B = len(lengths)
    requests = list(range(B + 2))
    if by_request:
        rng.shuffle(requests)
    per_request = [rng.randint(-1, T + 3) for _ in range(B + 2)]
    for b in range(B):
        per_request[requests[b]] = accepted[b]
    qsl = [0]
    for n in lengths:
        qsl.append(qsl[-1] + n)
    align = {}
    if align_slots is not None:
        table = [[0] * TABLE_WIDTH for _ in range(B + 2)]
        computed = [rng.randint(0, 3 * block_size) for _ in range(B + 2)]
        for b in range(B):
            table[requests[b]] = align_slots[b] if b < len(align_slots) else [0] * TABLE_WIDTH
            n = min(accepted[b], lengths[b])
            # even rows end exactly on the boundary of block 1, odd rows anywhere in blocks 0..1
            computed[requests[b]] = 2 * block_size - n if b % 2 == 0 and n > 0 else rng.randint(0, 2 * block_size - 1)
        align = dict(block_table=torch.tensor(table, dtype=torch.int32, device=device),
                     num_computed_tokens=torch.tensor(computed, dtype=torch.int32, device=device),
                     mamba_block_size=block_size)
    return Batch(as_int32(per_request, device), as_int32(sources, device), as_int32(qsl, device),
                 as_int32(requests, device) if by_request else None,
                 lengths, align)


def commit(ctx, batch: Batch, capture: bool) -> None:
    """``ctx.commit`` of ``batch``; with ``capture``, captured in a CUDA graph (after a call of
    the same shapes that commits nothing, which compiles the kernels) and replayed."""
    if not capture:
        ctx.commit(**batch.args())
        return
    ctx.commit(**{**batch.args(), "state_indices": torch.full_like(batch.state_indices, -1)})
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ctx.commit(**batch.args())
    graph.replay()


def assert_same_plan(ctx, other, batch: Batch) -> None:
    B = batch.state_indices.shape[0]
    for name in ("commit_lens", "final_state_indices", "boundary_state_indices", "boundary_recovery_lens"):
        assert torch.equal(getattr(ctx.plan, name)[:B], getattr(other.plan, name)[:B]), name


def check_round(ctx, ref_ctx, model: Model, batch: Batch, rounds: int, capture: bool = False) -> None:
    """Commit ``batch`` through both contexts (the kernels' ``commit``, with ``capture`` or not)
    and compare every buffer."""
    before = [[t.clone() for t in layer.kv_cache] for layer in model.layers]
    commit(ctx, batch, capture)
    ref_ctx.commit(**batch.args())
    assert_same_plan(ctx, ref_ctx, batch)
    for i, (layer, layer64, old) in enumerate(zip(model.layers, model.layers64, before)):
        conv, state, correction, key_gate = layer.kv_cache
        conv64, state64, _, _ = layer64.kv_cache
        assert same_bits(conv, conv64), f"layer {i}: conv state differs from the reference"
        assert same_bits(correction, old[2]) and same_bits(key_gate, old[3]), f"layer {i}: records written"
        live = ~torch.isnan(state64).any(dim=(1, 2, 3))
        assert same_bits(state[~live], old[1][~live]), f"layer {i}: a slot outside the plan changed"
        assert state_matches(state[live], state64[live], rounds), f"layer {i}: committed state"


def state_matches(actual: torch.Tensor, expected: torch.Tensor, rounds: int) -> bool:
    if actual.dtype == torch.float32:
        return rel_rmse(actual, expected) <= FP32_RMSE
    if rounds == 1:
        return within_rounding(actual, expected, BF16_ROUNDING)
    return rel_rmse(actual, expected) <= 1e-2  # bf16 roundings of the first round propagate


def slot_layout(rng: random.Random, T: int, align: bool) -> tuple[int, int, list[int], list[list[int]] | None]:
    """``(B, N, slots, align_slots)`` of ``make_batch``'s rows: ``N`` slots, slot 0 and three
    spare NaN slots among them, the others shuffled among the rows' sources and block tables."""
    B = T + 5
    per_row = 1 + (TABLE_WIDTH if align else 0)
    N = 1 + B * per_row + 3
    free = list(range(1, N))
    rng.shuffle(free)
    align_slots = [free[B + TABLE_WIDTH * b:B + TABLE_WIDTH * (b + 1)] for b in range(B)] if align else None
    return B, N, free[:B], align_slots


def run_two_rounds(device, L, H, K, V, T, state_dtype, align, conv_dim_first, lower_bound, dim=24, history=3,
                   capture=False, misaligned=False):
    seed = fresh_seed()
    rng = random.Random(seed)
    B, N, slots, align_slots = slot_layout(rng, T, align)
    model = make_model(device, L, N, H, K, V, T, dim, history, state_dtype, conv_dim_first, lower_bound, seed,
                       misaligned)
    ctx = KDARecoverSSMCommitContext.create(model.layers, spec_query_len=T, max_num_reqs=B + 1,
                                            conv_dim_first=conv_dim_first)
    assert ctx.tables.aligned is not misaligned
    ref_ctx = ReferenceCommitContext.create(model.layers64, spec_query_len=T, max_num_reqs=B + 1,
                                            conv_dim_first=conv_dim_first)
    for round_ in (1, 2):  # the second without request_indices
        batch = make_batch(device, T, slots, align_slots, block_size=T + round_ - 1, rng=rng, by_request=round_ == 1)
        fill_sources(model, batch, T, fill_state=round_ == 1)
        check_round(ctx, ref_ctx, model, batch, round_, capture)


COMMIT_DESIGNS = [f"commit-layers={design}" for design in kernels.launch.DESIGNS["commit-layers"]] + [
    f"commit-layers=one-launch,commit-context={design}" for design in kernels.launch.DESIGNS["commit-context"]]
"""Every design of the state commit, and beside the one launch every place of the conv
windows and the plan."""

CASES = [
    pytest.param(1, torch.float32, False, True, -5.0, 4, id="L1-fp32-stock"),
    pytest.param(3, torch.float32, True, True, -5.0, 4, id="L3-fp32-align"),
    pytest.param(3, torch.bfloat16, True, False, None, 3, id="L3-bf16-align-conv-dim-last-softplus"),
    pytest.param(3, torch.bfloat16, False, False, -5.0, 2, id="L3-bf16-stock-conv-dim-last"),
]


@pytest.mark.parametrize("designs", COMMIT_DESIGNS)
@pytest.mark.parametrize("L,state_dtype,align,conv_dim_first,lower_bound,T", CASES)
def test_two_rounds_match_reference(device, monkeypatch, designs, L, state_dtype, align, conv_dim_first,
                                    lower_bound, T):
    monkeypatch.setenv(kernels.launch.DESIGN_ENV, designs)
    run_two_rounds(device, L, H=2, K=16, V=32, T=T, state_dtype=state_dtype, align=align,
                   conv_dim_first=conv_dim_first, lower_bound=lower_bound)


@pytest.mark.gpu_only
@pytest.mark.parametrize("align", [False, True], ids=["stock", "align"])
@pytest.mark.parametrize("T", [4, 8])
def test_kimi_k3_shapes(device, align, T):
    run_two_rounds(device, L=4, H=12, K=128, V=128, T=T, state_dtype=torch.float32, align=align,
                   conv_dim_first=True, lower_bound=-5.0, dim=3 * 12 * 128, history=3)


@pytest.mark.parametrize("design", kernels.launch.DESIGNS["commit-layers"])
def test_a_plan_row_without_tokens_stores_nothing(device, monkeypatch, design):
    """A plan row with a real final slot and a count of 0 (kda's plans never write one, an
    engine's own may) leaves the row untouched, as ``CommitPlan`` says, under every design.
    The row beside it, with tokens, matches the float64 reference."""
    monkeypatch.setenv(kernels.launch.DESIGN_ENV, f"commit-layers={design}")
    N, H, K, V, T = 5, 2, 16, 32, 3
    gen = torch.Generator().manual_seed(fresh_seed())
    layers, layers64 = [], []
    for _ in range(2):
        state = torch.randn(N, H, V, K, generator=gen)
        records = allocate_records(N, H, T, K, V, torch.float32, "cpu")
        records.key_gate.copy_(torch.randn(records.key_gate.shape, generator=gen))
        records.correction.copy_(torch.randn(records.correction.shape, generator=gen))
        A_log, dt_bias = torch.rand(H, generator=gen).log(), torch.randn(H * K, generator=gen) * 0.5
        layers.append(LayerBuffers(state.to(device), KDARecoverSSMRecords(records.correction.to(device),
                                                                           records.key_gate.to(device)),
                                   A_log.to(device), dt_bias.to(device)))
        layers64.append((state.double(), KDARecoverSSMRecords(records.correction.double(), records.key_gate.double()),
                         A_log, dt_bias))
    # row 0: slot 1, no tokens, final slot 2; row 1: slot 3, two tokens folded in place
    state_indices, record_indices = as_int32([1, 3], device), as_int32([1, 3], device)
    plan = CommitPlan(*(as_int32(column, device) for column in ([0, 2], [2, 3], [0, 0], [0, 0])))
    before = [layer.checkpoint_state.clone() for layer in layers]
    kda_recoverssm_commit_layers(LayerTables.of(layers), -5.0, state_indices, plan, record_indices)
    for layer, (state64, records64, A_log, dt_bias), old in zip(layers, layers64, before):
        ref.kda_recoverssm_commit(state64, records64, A_log, dt_bias, -5.0, state_indices.cpu(),
                                  CommitPlan(*(column.cpu() for column in vars(plan).values())),
                                  record_indices.cpu())
        untouched = [0, 1, 2, 4]
        assert same_bits(layer.checkpoint_state[untouched], old[untouched]), "a slot the plan folds nothing into"
        assert rel_rmse(layer.checkpoint_state[3].cpu(), state64[3]) <= FP32_RMSE


def test_the_context_plans_inside_the_one_launch(device, monkeypatch):
    """Under the decision table the one launch plans its own rows: no plan launch runs, and
    the plan columns it stores match the reference's (``check_round``)."""
    def no_plan_launch(*args, **kwargs):
        raise AssertionError("a plan launch ran ahead of the one launch")

    monkeypatch.delenv(kernels.launch.DESIGN_ENV, raising=False)
    monkeypatch.setattr(kernels.context.layers, "plan_per_request", no_plan_launch)
    assert kernels.launch.commit_context_design() == "plan-in-commit"
    run_two_rounds(device, L=2, H=2, K=16, V=32, T=3, state_dtype=torch.float32, align=True, conv_dim_first=True,
                   lower_bound=-5.0)


def test_buffers_off_16_byte_boundaries_commit_alike(device, monkeypatch):
    """Buffers one element past a 16-byte boundary (views into larger storage) are not read
    as aligned: the tables say so and the one launch matches the reference all the same."""
    monkeypatch.setenv(kernels.launch.DESIGN_ENV, "commit-layers=one-launch")
    run_two_rounds(device, L=2, H=2, K=16, V=32, T=4, state_dtype=torch.float32, align=True, conv_dim_first=True,
                   lower_bound=-5.0, misaligned=True)


@pytest.mark.gpu_only
@pytest.mark.parametrize("designs", COMMIT_DESIGNS)
def test_a_commit_captured_in_a_cuda_graph_replays_it(device, monkeypatch, designs):
    """No host work, no allocation: the whole commit of every layer replays from a graph."""
    monkeypatch.setenv(kernels.launch.DESIGN_ENV, designs)
    run_two_rounds(device, L=3, H=12, K=128, V=128, T=4, state_dtype=torch.float32, align=True,
                   conv_dim_first=False, lower_bound=-5.0, capture=True)


def test_one_launch_until_a_layer_streams():
    """The one launch runs to B=32 at T=8 (B=64 with conv windows beside it) and to B=256 at
    T=4 (H=12); per-layer launches after."""
    design = kernels.launch.commit_layers_design
    assert [design(b, 12, 128, 8) for b in (1, 8, 32, 33, 256)] == ["one-launch"] * 3 + ["per-layer"] * 2
    assert [design(b, 12, 128, 8, conv=True) for b in (1, 33, 64, 65)] == ["one-launch"] * 3 + ["per-layer"]
    assert [design(b, 12, 128, 4, conv=conv) for b in (1, 64, 256, 257) for conv in (False, True)] == (
        ["one-launch"] * 6 + ["per-layer"] * 2)


def _context(device, L=2, **changes):
    model = make_model(device, L, 6, 2, 16, 16, 2, 8, 3, torch.float32, True, -5.0, seed=1)
    layers = [layer.__class__(**{**layer.__dict__, **changes}) if i == L - 1 else layer
              for i, layer in enumerate(model.layers)]
    return layers


@pytest.mark.parametrize("changes,message", [
    (dict(gate_lower_bound=None), r"layers\[1\]\.gate_lower_bound: None differs"),
    (dict(head_dim=32), r"layers\[1\]: local_num_heads=2, head_dim=32 do not match"),
    (dict(kv_cache=(torch.zeros(6, 8, 2),) * 3), r"layers\[1\]\.kv_cache: expected \(conv_state"),
])
def test_create_names_the_bad_layer(device, changes, message):
    with pytest.raises(ValueError, match=message):
        KDARecoverSSMCommitContext.create(_context(device, **changes), spec_query_len=2, max_num_reqs=4)


def test_create_takes_tuples_and_refuses_shared_buffers(device):
    layers = _context(device)
    from_tuples = KDARecoverSSMCommitContext.create([tuple(vars(layer).values()) for layer in layers],
                                                    spec_query_len=2, max_num_reqs=4)
    assert torch.equal(from_tuples.tables.state, KDARecoverSSMCommitContext.create(
        layers, spec_query_len=2, max_num_reqs=4).tables.state)
    conv, _, correction, key_gate = layers[1].kv_cache
    layers[1] = CommitLayer((conv, layers[0].kv_cache[1], correction, key_gate), *list(vars(layers[1]).values())[1:])
    with pytest.raises(ValueError, match=r"layers\[1\]\.checkpoint_state: starts where layers\[0\]'s does"):
        KDARecoverSSMCommitContext.create(layers, spec_query_len=2, max_num_reqs=4)


def test_create_refuses_layers_that_differ(device):
    layers = _context(device)
    conv, state, correction, key_gate = layers[1].kv_cache
    layers[1] = CommitLayer((conv, state.bfloat16(), correction, key_gate), *list(layers[1].__dict__.values())[1:])
    with pytest.raises(ValueError, match=r"layers\[1\]\.checkpoint_state: expected .* like layers\[0\]"):
        KDARecoverSSMCommitContext.create(layers, spec_query_len=2, max_num_reqs=4)
    short = _context(device)[:1]
    short[0] = CommitLayer((torch.zeros(6, 8, 1, device=device), *short[0].kv_cache[1:]),
                           *list(short[0].__dict__.values())[1:])
    with pytest.raises(ValueError, match=r"layers\[0\]\.kv_cache\[0\]: its 1 entries a channel hold no history"):
        KDARecoverSSMCommitContext.create(short, spec_query_len=2, max_num_reqs=4)


@pytest.mark.parametrize("change,message", [
    (dict(state_indices=torch.ones(5, dtype=torch.int32)), "state_indices: 5 rows exceed the context's max_num_reqs"),
    (dict(query_start_loc=torch.zeros(2, dtype=torch.int32)), "query_start_loc: expected 3 elements"),
    (dict(num_accepted_tokens=torch.ones(2, dtype=torch.int64)), "num_accepted_tokens: expected int32"),
    (dict(request_indices=torch.zeros(1, dtype=torch.int32)), "request_indices: holds 1 rows, the batch has 2"),
    (dict(block_table=torch.ones(2, 2, dtype=torch.int32)), "block_table: align mode needs"),
    (dict(block_table=torch.ones(2, 2, dtype=torch.int32), num_computed_tokens=torch.zeros(2, dtype=torch.int32),
          mamba_block_size=1), r"mamba_block_size: expected an int >= spec_query_len \(2\)"),
])
def test_commit_names_the_bad_argument_and_writes_nothing(device, change, message):
    layers = _context(device)
    ctx = KDARecoverSSMCommitContext.create(layers, spec_query_len=2, max_num_reqs=4)
    before = [t.clone() for layer in layers for t in layer.kv_cache]
    args = dict(num_accepted_tokens=torch.full((2,), 2, dtype=torch.int32),
                state_indices=torch.tensor([1, 2], dtype=torch.int32),
                query_start_loc=torch.tensor([0, 2, 4], dtype=torch.int32))
    args = {name: t.to(device) if isinstance(t, torch.Tensor) else t for name, t in {**args, **change}.items()}
    with pytest.raises(ValueError, match=message):
        ctx.commit(**args)
    assert all(same_bits(a, b) for a, b in zip((t for layer in layers for t in layer.kv_cache), before))


def _twin(layers: list[CommitLayer]) -> list[CommitLayer]:
    """Layers over copies of ``layers``' buffers (the same gate parameters)."""
    return [CommitLayer(tuple(t.clone() for t in layer.kv_cache), *list(vars(layer).values())[1:])
            for layer in layers]


def _module_context_rounds(device, context_type, L, T, state_dtype, align, conv_dim_first, captured=False):
    """Two rounds (as ``run_two_rounds``) of the same commits through kda's context and
    through ``context_type`` (the example module's) on a twin of the buffers; returns, per
    round, kda's buffers and the module's after the commit, and the batch."""
    seed = fresh_seed()
    rng = random.Random(seed)
    B, N, slots, align_slots = slot_layout(rng, T, align)
    model = make_model(device, L, N, 2, 16, 16, T, 24, 3, state_dtype, conv_dim_first, -5.0, seed)
    mine = _twin(model.layers)
    ctx = KDARecoverSSMCommitContext.create(model.layers, spec_query_len=T, max_num_reqs=B + 1,
                                            conv_dim_first=conv_dim_first)
    module_ctx = context_type.create(mine, spec_query_len=T, max_num_reqs=B + 1, conv_dim_first=conv_dim_first)
    rounds = []
    for round_ in (1, 2):
        batch = make_batch(device, T, slots, align_slots, block_size=T + round_ - 1, rng=rng, by_request=round_ == 1)
        fill_sources(model, batch, T, fill_state=round_ == 1)
        for layer, twin in zip(model.layers, mine):
            for theirs, ours in zip(layer.kv_cache, twin.kv_cache):
                ours.copy_(theirs)
        ctx.commit(**batch.args())
        commit(module_ctx, batch, captured)
        assert_same_plan(ctx, module_ctx, batch)
        rounds.append(([layer.kv_cache for layer in model.layers], [layer.kv_cache for layer in mine], batch))
    return rounds


MODULE_CASES = [
    pytest.param(2, 4, torch.float32, False, True, id="L2-T4-fp32-stock-conv-dim-first"),
    pytest.param(3, 3, torch.float32, True, False, id="L3-T3-fp32-align-conv-dim-last"),
    pytest.param(2, 2, torch.bfloat16, True, True, id="L2-T2-bf16-align-conv-dim-first"),
    pytest.param(2, 4, torch.bfloat16, False, False, id="L2-T4-bf16-stock-conv-dim-last"),
]


@pytest.mark.parametrize("L,T,state_dtype,align,conv_dim_first", MODULE_CASES)
def test_the_example_modules_context_equals_kdas_bit_for_bit(device, L, T, state_dtype, align, conv_dim_first):
    """The example engine's own context (plan on the rows' requests, conv windows moved with
    torch, a commit a layer) leaves every buffer of every layer as kda's context does, bit
    for bit, over two rounds of every accept length, padding, null slots and align boundaries."""
    from examples.recoverssm_module import EngineCommitContext

    for kda_buffers, module_buffers, _ in _module_context_rounds(device, EngineCommitContext, L, T, state_dtype,
                                                                 align, conv_dim_first):
        for i, (theirs, ours) in enumerate(zip(kda_buffers, module_buffers)):
            for name, a, b in zip(("conv_state", "checkpoint_state", "correction", "key_gate"), theirs, ours):
                assert same_bits(a, b), f"layer {i}: {name} differs from kda's context"


@pytest.mark.gpu_only
def test_the_example_modules_context_replays_from_a_cuda_graph(device):
    """No host read, no allocation a commit: captured after one commit of padding rows, it replays."""
    from examples.recoverssm_module import EngineCommitContext

    for kda_buffers, module_buffers, _ in _module_context_rounds(device, EngineCommitContext, 3, 4, torch.float32,
                                                                 True, False, captured=True):
        assert all(same_bits(a, b) for theirs, ours in zip(kda_buffers, module_buffers) for a, b in zip(theirs, ours))


@pytest.mark.parametrize("conv_dim_first", [True, False], ids=["conv-dim-first", "conv-dim-last"])
def test_the_conv_window_bug_moves_layer_1s_full_windows_one_entry_early(device, conv_dim_first):
    """``EarlyConvWindowContext`` differs from kda's context only in layer 1's conv state,
    only at entries ``0 .. history - 1`` of the final slots of rows that accept all T tokens,
    which hold the source's entries ``T - 2 ..``; states and every other window match."""
    from examples.recoverssm_module import EarlyConvWindowContext

    T, history = 4, 3
    for kda_buffers, module_buffers, batch in _module_context_rounds(device, EarlyConvWindowContext, 2, T,
                                                                     torch.float32, False, conv_dim_first):
        full = [s for b, s in enumerate(batch.state_indices.tolist()) if s > 0 and batch.lengths[b] == T
                and int(batch.num_accepted[b if batch.request_indices is None else batch.request_indices[b]]) >= T]
        assert full
        for i, (theirs, ours) in enumerate(zip(kda_buffers, module_buffers)):
            assert all(same_bits(a, b) for a, b in zip(theirs[1:], ours[1:])), f"layer {i}: state or records"
            conv, expected = (c if conv_dim_first else c.transpose(1, 2) for c in (ours[0], theirs[0]))
            if i != 1:
                assert same_bits(conv, expected), f"layer {i}: conv state"
                continue
            bits = [c.contiguous().view(torch.int16) for c in (conv, expected)]  # bfloat16: NaNs compared by bits
            differs = (bits[0] != bits[1]).any(dim=1).nonzero().tolist()
            assert sorted({slot for slot, _ in differs}) == sorted(full)
            assert all(entry < history for _, entry in differs)
            for slot in full:
                assert same_bits(conv[slot, :, 1:history], expected[slot, :, :history - 1])
