"""The released engine, vLLM 0.33.0's stock RecoverSSM module, fetched from the package index
(``tests.support.vllm_release``): kda's commit context and reference follow its records and align-mode
rule, an engine over it (``examples/vllm_engine.py``) records and replays through kda's kernels,
the reference and the release itself, and a bug in a subclass of its context is reported and
shrunk to a bundle that replays without vLLM.

Under the Triton interpreter the release's verify, plan and conv kernels run, its state commit
does not (pointer tables): there kda's fold of its plan stands in for that launch
(``traces.impl.release.interpreter_state_commit``) and the release's states are compared on a
GPU only.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kernels.context.engine import CommitLayer, KDARecoverSSMCommitContext
from kernels.context.reference import ReferenceCommitContext
from tests.support.kernel_problems import rel_rmse, same_bits
from tests.support.seeds import fresh_seed
from tests.support.trace_helpers import run_kda
from tests.support.vllm_release import MODULE, import_release, release_env, release_tree, set_conv_state_dim_first
from traces.impl.release import interpreted, interpreter_state_commit

ROOT = Path(__file__).resolve().parents[3]
NAN = float("nan")
H, K, T, L, DIM = 2, 16, 4, 2, 8
WIDTH = 3  # conv width: S = W - 1 + T - 1 entries a channel
TABLE = 3
PLAN = ("commit_lens", "final_state_indices", "boundary_state_indices", "boundary_recovery_lens")


@pytest.fixture(scope="module")
def release():
    module, reason = import_release()
    if module is None:
        pytest.skip(reason)
    yield module
    set_conv_state_dim_first(False)


def _i32(values, device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


def _step(rng: random.Random, device, align: bool, N: int):
    """One step's commit arguments: rows 0..T with real slots taking accept lengths T, 0..T-1;
    a partial window; a null slot with tokens; two padding rows. Align mode: each real row's
    block-table row of distinct slots and a computed count; row 0 crosses a boundary in
    block 0 and its final block's slot is null (the two rules differ there), row 1 ends exactly
    on a boundary. Returns ``(args, lengths)``."""
    reals = T + 2
    accepted = [T, *rng.sample(range(T), T), T, T, 0, 0]
    lengths = [T] * (T + 1) + [T - 1, T, 0, 0]
    B = len(lengths)
    free = list(range(1, N))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(TABLE)] for _ in range(reals)] if align else None
    block = T
    computed = [rng.randint(1, 2 * block - 1) for _ in range(reals)]
    if align:
        computed[0], computed[1] = block - 1, 2 * block - T
        tables[0][1] = 0
    sources = [tables[b][(computed[b] - 1) // block] if align else free.pop() for b in range(reals)] + [0, -1, -1]
    requests = list(range(B + 2))
    rng.shuffle(requests)
    per_request = [rng.randint(0, T) for _ in range(B + 2)]
    for b in range(B):
        per_request[requests[b]] = accepted[b]
    args = dict(num_accepted_tokens=_i32(per_request, device), state_indices=_i32(sources, device),
                query_start_loc=_i32([0, *torch.tensor(lengths).cumsum(0).tolist()], device),
                request_indices=_i32(requests, device))
    if align:
        table, counts = [[0] * TABLE for _ in range(B + 2)], [0] * (B + 2)
        for b in range(reals):
            table[requests[b]], counts[requests[b]] = tables[b], computed[b]
        args.update(block_table=_i32(table, device), num_computed_tokens=_i32(counts, device), mamba_block_size=block)
    return args, lengths


def _buffers(device, N: int, R: int, dim_first: bool, gen: torch.Generator) -> list[list[torch.Tensor]]:
    """L layers' ``[conv, state, correction, key_gate]``, NaN everywhere (records a row per batch row)."""
    S = WIDTH - 1 + T - 1
    return [[torch.full((N, DIM, S) if dim_first else (N, S, DIM), NAN, dtype=torch.bfloat16, device=device),
             torch.full((N, H, K, K), NAN, device=device), torch.full((R, H, T, K), NAN, device=device),
             torch.full((R, H, T, 2 * K), NAN, dtype=torch.bfloat16, device=device)] for _ in range(L)]


def _fill(buffers, args: dict, lengths: list[int], gen: torch.Generator) -> None:
    """Each real row's source state and conv window and its records (batch row b's, its tokens only)."""
    for conv, state, correction, key_gate in buffers:
        for b, slot in enumerate(args["state_indices"].tolist()):
            if slot <= 0:
                continue
            state[slot] = torch.randn(state.shape[1:], generator=gen).to(state)
            conv[slot] = torch.randn(conv.shape[1:], generator=gen).to(conv)
            correction[b], key_gate[b] = NAN, NAN
            n = lengths[b]
            correction[b, :, :n] = torch.randn(correction[b, :, :n].shape, generator=gen).to(correction)
            key_gate[b, :, :n] = torch.randn(key_gate[b, :, :n].shape, generator=gen).to(key_gate)


@pytest.mark.gpu
@pytest.mark.parametrize("align,dim_first", [(False, True), (True, False)])
def test_kdas_context_and_reference_follow_the_release(release, device, align, dim_first):
    """kda's context (records by batch row, the release's rule) and the float64 reference against
    the release's own context, two rounds: plan columns and conv states bit for bit, states
    within fp32 rounding of the reference (and of the release on a GPU); slots and records
    outside the plan keep their NaN bits. kda's own rule gives another plan at the rows where
    the rules differ."""
    seed = fresh_seed()
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    N, R = 1 + TABLE * (T + 2) + 2, T + 6
    set_conv_state_dim_first(dim_first)
    mine = _buffers(device, N, R, dim_first, gen)
    A_log = [torch.rand(H, generator=gen).log().to(device) for _ in range(L)]
    dt_bias = [(torch.randn(H * K, generator=gen) * 0.5).to(device) for _ in range(L)]
    twins = {"kda": mine, "ref": [[t.clone() if i == 0 else t.double() for i, t in enumerate(b)] for b in mine],
             "release": [[t.clone() for t in b] for b in mine], "kda-rule": [[t.clone() for t in b] for b in mine]}

    def model(buffers):
        return [CommitLayer(tuple(b), A_log[i], dt_bias[i], H, K, -5.0) for i, b in enumerate(buffers)]

    options = dict(spec_query_len=T, max_num_reqs=T + 5, conv_dim_first=dim_first)
    contexts = {"kda": KDARecoverSSMCommitContext.create(model(mine), records="batch_row", rule="vllm-0.33.0",
                                                         **options),
                "ref": ReferenceCommitContext.create(model(twins["ref"]), records="batch_row", rule="vllm-0.33.0",
                                                     **options),
                "kda-rule": KDARecoverSSMCommitContext.create(model(twins["kda-rule"]), records="batch_row",
                                                              **options)}
    layers = [SimpleNamespace(kv_cache=(b[0], b[1]), recoverssm_records=release.KDARecoverSSMRecords(b[2], b[3]),
                              A_log=A_log[i], dt_bias=dt_bias[i], local_num_heads=H, head_dim=K, gate_lower_bound=-5.0)
              for i, b in enumerate(twins["release"])]
    theirs = release.KDARecoverSSMCommitContext.create(layers, spec_query_len=T, max_num_reqs=T + 5)
    for round_ in range(2):
        args, lengths = _step(rng, device, align, N)
        _fill(mine, args, lengths, torch.Generator().manual_seed(seed + round_))
        for name in ("ref", "release", "kda-rule"):
            for a, b in zip(mine, twins[name]):
                for x, y in zip(a, b):
                    y.copy_(x)
        before = [[t.clone() for t in b] for b in mine]
        for ctx in contexts.values():
            ctx.commit(**args)
        with interpreter_state_commit(theirs, args["state_indices"]):
            theirs.commit(**args)
        B = args["state_indices"].shape[0]
        what = f"round {round_}, align {align}, dim_first {dim_first}"
        for column in PLAN:
            expected = getattr(theirs, column)[:B]
            assert torch.equal(getattr(contexts["kda"].plan, column)[:B], expected), f"{what}: {column}"
            assert torch.equal(getattr(contexts["ref"].plan, column)[:B], expected), f"{what}: ref {column}"
        if align:
            assert not torch.equal(contexts["kda-rule"].plan.boundary_recovery_lens[:B], theirs.boundary_recovery_lens[:B])
            assert not torch.equal(twins["kda-rule"][0][1].nan_to_num(), mine[0][1].nan_to_num()), \
                f"{what}: kda's rule wrote what the release's does not (the null final row's boundary)"
        for i in range(L):
            conv, state, correction, key_gate = mine[i]
            assert same_bits(conv, twins["release"][i][0]) and same_bits(conv, twins["ref"][i][0]), f"{what}: conv"
            assert same_bits(correction, before[i][2]) and same_bits(key_gate, before[i][3]), f"{what}: records"
            state64 = twins["ref"][i][1]
            live = ~torch.isnan(state64).any(dim=(1, 2, 3))
            assert same_bits(state[~live], before[i][1][~live]), f"{what}: layer {i}: a slot outside the plan"
            assert rel_rmse(state[live], state64[live]) <= 1e-5, f"{what}: layer {i}: committed state"
            if not interpreted():
                assert rel_rmse(twins["release"][i][1][live], state64[live]) <= 1e-5, f"{what}: the release's state"


def _record_engine(path: Path, root: Path, engine_args: list[str], patch: str = MODULE,
                   dim_first: bool = False) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "kda_cli", "record", "run", str(path), "--patch", patch, "--layers", "all",
               "--", sys.executable, str(ROOT / "examples" / "vllm_engine.py"), *engine_args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=release_env(root, dim_first))


def _engine_output(root: Path, engine_args: list[str], dim_first: bool = False) -> str:
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "vllm_engine.py"), *engine_args], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, env=release_env(root, dim_first))
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_an_engine_on_the_release_records_and_replays(release, tmp_path, capsys, monkeypatch):
    """``examples/vllm_engine.py`` in align mode (its rows also commit as stock rows do) with
    vLLM's default conv layout, recorded unedited with ``--patch MODULE --layers all``: its
    output is the unrecorded run's, and the trace (records by batch row, the release's rule)
    replays with exit 0 through kda's kernels, the reference and the release, bit for bit
    through the release. (The other layout: the contexts' test above and the GPU run.)"""
    root, _ = release_tree()
    engine_args = ["--steps", "3", "--layers", "2", "--align", "--seed", str(fresh_seed() % 1000)]
    path = tmp_path / "release.safetensors"
    run = _record_engine(path, root, engine_args)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(_engine_output(root, engine_args)), run.stdout
    from traces.format.io import read_trace

    with read_trace(path) as trace:
        commits = [e for e in trace.events if e.op == "commit_layers"]
        assert trace.manifest.num_layers == 2 and len(commits) == 3
        assert {(e.attrs["records"], e.attrs["rule"]) for e in commits} == {("batch_row", "vllm-0.33.0")}
        assert trace.manifest.conv.layout == "token_first"
        assert sum(e.op == "verify" for e in trace.events) == 6
    monkeypatch.syspath_prepend(str(root))
    for impl, exact in (("triton", False), ("reference", False), (MODULE, True)):
        args = ["replay", str(path), "--impl", impl, "--no-progress"] + (["--atol", "0", "--rtol", "0"] if exact
                                                                          else [])
        code, out, err = run_kda(args, capsys, monkeypatch)
        assert code == 0, f"{impl}: {out}{err}"


def test_a_context_subclass_that_corrupts_a_state_is_reported_and_shrunk(release, tmp_path, capsys, monkeypatch):
    """A subclass of the release's context whose commit corrupts layer 1's state at one slot
    (``tests/broken_impls/release_corrupts_state.py``), recorded as the engine's module: the
    replay through kda's kernels exits 1 naming the commit, layer 1, the slot the plan wrote and
    the coordinate, and ``kda repro`` writes a bundle that fails the same way on a machine
    without vLLM (the module's tree off ``PYTHONPATH``)."""
    root, _ = release_tree()
    path = tmp_path / "bug.safetensors"
    patch = "tests.broken_impls.release_corrupts_state"
    run = _record_engine(path, root, ["--steps", "2", "--layers", "2", "--module", patch], patch=patch)
    assert run.returncode == 0, run.stderr
    code, out, err = run_kda(["replay", str(path), "--format", "json", "--no-progress"], capsys, monkeypatch)
    assert code == 1, out + err
    failed = [e for e in json.loads(out)["events"] if not e["passed"]]
    bad = next(t["first_bad"] for t in failed[0]["tensors"] if t["first_bad"])
    assert (bad["op"], bad["tensor"], bad["layer"]) == ("commit_layers", "states", 1), bad
    assert (bad["head"], bad["v"], bad["k"]) == (0, 1, 2), bad
    assert bad["slot"] > 0, bad
    bundle = tmp_path / "bundle"
    code, out, err = run_kda(["repro", str(path), "--out", str(bundle), "--impl", "triton"], capsys, monkeypatch)
    assert code == 1, out + err
    env = {k: v for k, v in release_env(root).items() if k != "PYTHONPATH"}  # a machine without vLLM
    replay = subprocess.run(["sh", str(bundle / "repro.sh")], capture_output=True, text=True, env=env, timeout=600)
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert "op=commit_layers tensor=states layer=1" in replay.stdout and "head=0 v=1 k=2" in replay.stdout, \
        replay.stdout


def test_the_cute_backend_is_said_not_recorded(release, tmp_path, capsys):
    """A context created with ``backend="cute"`` (SM10x): one stderr line and the provenance
    say the verify is not recorded and how to run the Triton backend."""
    from traces.record.patch import PatchRecorder, patch_context_class

    class Context(release.KDARecoverSSMCommitContext):  # patched apart from the module's own class
        pass

    recorder = PatchRecorder(tmp_path / "t.safetensors", [MODULE], layers="all")
    patch_context_class(Context, recorder)
    N, R = 4, 2
    conv, state = torch.zeros(N, 5, DIM, dtype=torch.bfloat16), torch.zeros(N, H, K, K)
    layer = SimpleNamespace(kv_cache=(conv, state), recoverssm_records=release.KDARecoverSSMRecords.allocate(
        R, H, T, K, torch.bfloat16, "cpu"), A_log=torch.zeros(H), dt_bias=torch.zeros(H * K), local_num_heads=H,
        head_dim=K, gate_lower_bound=-5.0)
    context = Context.create([layer], spec_query_len=T, max_num_reqs=R, backend="cute")
    assert context.backend == "cute"
    assert "--mamba-ssm-cache-dtype float32" in capsys.readouterr().err
    assert recorder.provenance["not_recorded"][0].startswith("verify: the release's CuTe backend")
