"""The recorder never changes or breaks the program it records: a patched module's function is
called with exactly the arguments the program passed (no keyword added, none dropped), and
returns exactly what the function returned, whatever subset of kda's parameters the
function takes, in whatever order, positionally or by keyword. What the recorder cannot
represent, or a failure of its own, ends the recording (``stopped_by``) and nothing else."""

from __future__ import annotations

import inspect
import random
from types import ModuleType

import pytest
import torch

from tests.support.seeds import fresh_seed
from traces.record.patch import PatchRecorder, patch_module
from traces.record.recorder import Recorder

H, K, T, B, N = 2, 4, 2, 2, 4
KDA = [name for name in inspect.signature(Recorder.kda_recoverssm_verify).parameters if name != "self"]
OPTIONAL = ("out", "record_indices")


def _arguments() -> dict:
    """A valid verify call's arguments by kda's names."""
    from kernels.buffers import allocate_records

    tokens = B * T
    return dict(q=torch.randn(1, tokens, H, K), k=torch.randn(1, tokens, H, K), v=torch.randn(1, tokens, H, K),
                raw_g=torch.randn(1, tokens, H, K), raw_beta=torch.randn(1, tokens, H), A_log=torch.zeros(H),
                dt_bias=torch.zeros(H * K), lower_bound=-5.0, checkpoint_state=torch.randn(N, H, K, K),
                records=allocate_records(N, H, T, K, K, torch.float32, "cpu"),
                query_start_loc=torch.tensor([0, T, 2 * T], dtype=torch.int32),
                state_indices=torch.tensor([1, 3], dtype=torch.int32), spec_query_len=T,
                out=torch.empty(1, tokens, H, K), record_indices=torch.tensor([2, 0], dtype=torch.int32))


def _module(params: list[str], returns_tensor: bool) -> tuple[ModuleType, list]:
    """A module whose verify takes ``params`` (kda's names, its own order) and notes each call's
    arguments; it returns a tensor of ``v``'s shape, or an object the recorder cannot read."""
    module = ModuleType("subset_engine")
    calls: list = []
    signature = ", ".join(p + ("=None" if p in OPTIONAL else "") for p in params)
    result = "torch.zeros(1, 4, 2, 4)" if returns_tensor else "SENTINEL"
    body = f"def kda_recoverssm_verify({signature}):\n    calls.append(dict(locals()))\n    return {result}\n"
    namespace = {"calls": calls, "torch": torch, "SENTINEL": object()}
    exec(body, namespace)
    module.kda_recoverssm_verify = namespace["kda_recoverssm_verify"]
    return module, calls


@pytest.mark.parametrize("case", range(8))
def test_a_patched_function_gets_exactly_the_programs_arguments(case, tmp_path):
    rng = random.Random(fresh_seed())
    required = [p for p in KDA if p not in OPTIONAL and (case < 4 or rng.random() > 0.2)]
    optional = [p for p in OPTIONAL if rng.random() < 0.5]
    rng.shuffle(required)
    params = required + optional
    module, calls = _module(params, returns_tensor=case % 2 == 0)
    recorder = PatchRecorder(tmp_path / "t.safetensors", ["subset_engine"])
    function = module.kda_recoverssm_verify
    patch_module(module, recorder)
    assert module.kda_recoverssm_verify is not function
    values = _arguments()
    split = rng.randint(0, len(params))
    positional = [values[p] for p in params[:split]]
    keywords = {p: values[p] for p in rng.sample(params[split:], len(params) - split)}
    what = f"verify({', '.join(params)}) called with {split} positional"
    result = module.kda_recoverssm_verify(*positional, **keywords)
    assert len(calls) == 1, what
    assert set(calls[0]) == set(params) and all(calls[0][p] is values[p] for p in params), what
    lacking = [p for p in KDA if p not in OPTIONAL and p not in params]
    if case % 2 == 0 and not lacking:
        assert isinstance(result, torch.Tensor) and recorder.events == 1 and recorder.stopped is None, what
    else:
        assert recorder.events == 0 and recorder.stopped, what
        if lacking:
            assert lacking[0] in recorder.stopped, recorder.stopped
    recorder.close()


def test_a_function_the_program_calls_wrongly_raises_its_own_error(tmp_path):
    """A call that does not bind to the function raises the function's own ``TypeError``."""
    module, calls = _module(KDA[:13], returns_tensor=True)
    recorder = PatchRecorder(tmp_path / "t.safetensors", ["subset_engine"])
    patch_module(module, recorder)
    with pytest.raises(TypeError, match="unexpected keyword argument 'nonsense'"):
        module.kda_recoverssm_verify(nonsense=1)
    assert calls == []
    recorder.close()
