"""Verify against the float64 reference: a gate whose sigmoid overflows, a batch without
tokens, and the arguments it refuses."""

from __future__ import annotations

import pytest
import torch

import kernels
import kernels.reference as ref
from tests.support.kernel_checks import check_verify
from tests.support.kernel_problems import Problem, float64_records, make_problem, same_bits
from tests.support.seeds import fresh_seed

pytestmark = pytest.mark.gpu


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
