"""Random RecoverSSM problems for kernel tests, and the comparisons they need.

A problem is a speculative batch with every kind of row (full windows, partial windows,
zero-length rows, CUDA-graph padding, null slots with tokens), NaN in every slot and
record row the batch does not name, and a float64 twin of every buffer for the reference.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import kernels
from kernels.buffers import KDARecoverSSMRecords

_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN payloads included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    view = _INT_VIEW[a.element_size()]
    return torch.equal(a.contiguous().view(view), b.contiguous().view(view))


def rel_rmse(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||actual - expected|| / ||expected||`` in float64; NaN anywhere gives inf."""
    a, e = actual.double(), expected.double()
    if not (torch.isfinite(a).all() and torch.isfinite(e).all()):
        return float("inf")
    return ((a - e).norm() / e.norm().clamp(min=1e-300)).item()


def within_rounding(actual: torch.Tensor, expected: torch.Tensor, unit_roundoff: float) -> bool:
    """Each element within one rounding of ``actual``'s dtype of the exact value (plus a
    float32-arithmetic allowance), i.e. ``|a - e| <= u*|e| + 1e-5 * rms(e)``."""
    a, e = actual.double(), expected.double()
    rms = e.pow(2).mean().sqrt()
    return bool(((a - e).abs() <= unit_roundoff * e.abs() + 1e-5 * rms).all())


def float64_records(records: KDARecoverSSMRecords) -> KDARecoverSSMRecords:
    return KDARecoverSSMRecords(records.correction.double(), records.key_gate.double())


@dataclass
class Problem:
    """Inputs of one verify call plus the buffers it reads and writes."""

    H: int
    K: int
    V: int
    T: int
    lower_bound: float | None
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    raw_g: torch.Tensor
    raw_beta: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    query_start_loc: torch.Tensor
    state_indices: torch.Tensor
    record_indices: torch.Tensor | None
    state: torch.Tensor
    records: KDARecoverSSMRecords
    lengths: list[int] = field(default_factory=list)

    @property
    def batch(self) -> int:
        return len(self.lengths)

    def record_rows(self) -> torch.Tensor:
        if self.record_indices is not None:
            return self.record_indices
        return torch.arange(self.batch, dtype=torch.int32, device=self.state.device)

    def activations(self, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, ...]:
        acts = (self.q, self.k, self.v, self.raw_g, self.raw_beta)
        return acts if dtype is None else tuple(x.to(dtype) for x in acts)

    def verify(self, impl, state, records, out=None, acts_dtype=None):
        q, k, v, g, beta = self.activations(acts_dtype)
        if out is None:
            out = torch.full_like(v, float("nan"))
        return impl.kda_recoverssm_verify(
            q, k, v, g, beta, self.A_log, self.dt_bias, self.lower_bound, state, records,
            self.query_start_loc, self.state_indices, self.T, out=out, record_indices=self.record_indices)


def standard_rows(T: int) -> tuple[list[int], list[int]]:
    """Rows for every accept length 0..T (full windows), then a partial window, a
    zero-length row with a real slot, a CUDA-graph padding row and a null row with tokens.
    Returns (lengths, slot_kinds) with kind 1 real, 0 null, -1 padding."""
    lengths = [T] * (T + 1) + [max(T - 1, 1), 0, 0, T]
    kinds = [1] * (T + 1) + [1, 1, -1, 0]
    return lengths, kinds


def make_problem(device: str, *, H: int, K: int, V: int, T: int, act: torch.dtype, state_dtype: torch.dtype,
                 lower_bound: float | None, seed: int, with_record_indices: bool = True,
                 lengths: list[int] | None = None, kinds: list[int] | None = None,
                 large_gates: bool = False) -> Problem:
    """A fresh random problem; unused slots, record rows and outputs hold NaN."""
    gen = torch.Generator().manual_seed(seed)
    if lengths is None:
        lengths, kinds = standard_rows(T)
    B = len(lengths)
    total = sum(lengths) + (sum(lengths) < B * T)  # a trailing token that no row owns, where allowed

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(act).to(device)

    q, k = randn(1, total, H, K), randn(1, total, H, K)
    v = randn(1, total, H, V)
    raw_g = randn(1, total, H, K, scale=2.0)
    if large_gates:  # exercise the linear branch of softplus (x > 20)
        raw_g = raw_g + (torch.rand(1, total, H, K, generator=gen) < 0.3).to(act).to(device) * 24.0
    raw_beta = randn(1, total, H)
    A_log = (torch.rand(H, generator=gen) * 1.5 - 1.0).to(device)
    dt_bias = (torch.randn(H * K, generator=gen) * 0.5).to(device)

    qsl = [0]
    for n in lengths:
        qsl.append(qsl[-1] + n)
    num_slots = 2 * B + 4
    perm = (torch.randperm(num_slots - 1, generator=gen) + 1).tolist()
    slots = [perm[b] if kinds[b] == 1 else kinds[b] for b in range(B)]
    state = torch.full((num_slots, H, V, K), float("nan"), dtype=state_dtype)
    for s in slots:
        if s > 0:
            state[s] = torch.randn(H, V, K, generator=gen).to(state_dtype) * 0.5
    num_rec = 2 * B if with_record_indices else B
    record_indices = None
    if with_record_indices:
        record_indices = torch.randperm(num_rec, generator=gen)[:B].to(torch.int32).to(device)
    records = kernels.allocate_records(num_rec, H, T, K, V, act, device, fill=float("nan"))
    return Problem(
        H=H, K=K, V=V, T=T, lower_bound=lower_bound, q=q, k=k, v=v, raw_g=raw_g, raw_beta=raw_beta,
        A_log=A_log, dt_bias=dt_bias,
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        state_indices=torch.tensor(slots, dtype=torch.int32, device=device),
        record_indices=record_indices, state=state.to(device), records=records, lengths=lengths,
    )
