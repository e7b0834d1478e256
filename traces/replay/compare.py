"""Comparison of one produced tensor with its expected value.

An element passes when ``|a - b| <= atol + rtol * |b|`` (torch semantics) and both are
finite: NaN and Inf never pass. Metrics are computed in float64 over the compared
elements: max abs, max rel (``|a-b| / (|b| + REL_EPS)``), relative RMSE
(``||a-b|| / ||b||``), mismatch count, and the ULP distance for bfloat16.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from traces.replay.tolerances import DEFAULT_TOLERANCES, EXACT, Tolerance  # noqa: F401  (re-exported)

REL_EPS = 1e-6
"""Added to ``|b|`` in max rel, so that exact zeros do not divide by zero."""


@dataclass
class BadElement:
    """One failing element: its index in the compared tensor, the values, and coordinates
    named by the caller (event, op, tensor, batch row, slot, head, v, k, ...)."""

    index: tuple[int, ...]
    actual: float
    expected: float
    coords: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**self.coords, "index": list(self.index), "actual": _num(self.actual), "expected": _num(self.expected)}


@dataclass
class Comparison:
    """Metrics of one tensor; ``first_bad`` / ``worst_bad`` are None when nothing fails."""

    tensor: str
    role: str
    dtype: str
    tolerance: Tolerance
    compared: int
    max_abs: float
    max_rel: float
    rel_rmse: float
    mismatches: int
    max_ulp: int | None
    first_bad: BadElement | None = None
    worst_bad: BadElement | None = None

    @property
    def passed(self) -> bool:
        return self.mismatches == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "tensor": self.tensor, "role": self.role, "dtype": self.dtype,
            "atol": self.tolerance.atol, "rtol": self.tolerance.rtol, "compared": self.compared,
            "max_abs": _num(self.max_abs), "max_rel": _num(self.max_rel), "rel_rmse": _num(self.rel_rmse),
            "mismatches": self.mismatches, "max_ulp": self.max_ulp, "passed": self.passed,
            "first_bad": self.first_bad.to_json() if self.first_bad else None,
            "worst_bad": self.worst_bad.to_json() if self.worst_bad else None,
        }


def _num(x: float) -> float | str:
    """JSON has no NaN or Inf: spell them as strings."""
    return x if math.isfinite(x) else str(x)


def bf16_ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in bfloat16 units in the last place between two bfloat16 tensors (int64)."""
    def ordered(x: torch.Tensor) -> torch.Tensor:
        bits = x.contiguous().view(torch.int16).to(torch.int64) & 0xFFFF
        return torch.where(bits >= 0x8000, 0x8000 - bits, bits)

    return (ordered(a) - ordered(b)).abs()


def compare(actual: torch.Tensor, expected: torch.Tensor, tolerance: Tolerance, *, tensor: str, role: str,
            mask: torch.Tensor | None = None) -> Comparison:
    """Compare ``actual`` with ``expected`` (same shape and dtype) where ``mask`` is true.

    ``mask`` broadcasts to the shape (None compares every element). The first bad element
    is the first in row-major order; the worst is the one furthest past its tolerance
    (non-finite ones first).
    """
    a_raw, e_raw = actual.detach().cpu(), expected.detach().cpu()
    dtype = str(e_raw.dtype).removeprefix("torch.")
    a, e = a_raw.to(torch.float64), e_raw.to(torch.float64)
    selected = torch.ones(a.shape, dtype=torch.bool) if mask is None else mask.cpu().expand(a.shape)
    diff = (a - e).abs()
    finite = torch.isfinite(a) & torch.isfinite(e)
    limit = tolerance.atol + tolerance.rtol * e.abs()
    bad = selected & ~(finite & (diff <= limit))
    count = int(selected.sum())
    if count:
        d, ev = diff[selected], e[selected]
        max_abs = float(d.max())
        max_rel = float((d / (ev.abs() + REL_EPS)).max())
        norm = float(ev.norm())
        rel_rmse = float(d.norm()) / norm if norm > 0 else (0.0 if float(d.norm()) == 0 else math.inf)
    else:
        max_abs = max_rel = rel_rmse = 0.0
    max_ulp = None
    if e_raw.dtype == torch.bfloat16 and count:
        max_ulp = int(bf16_ulp_distance(a_raw, e_raw)[selected].max())
    result = Comparison(tensor, role, dtype, tolerance, count, max_abs, max_rel, rel_rmse, int(bad.sum()), max_ulp)
    if result.mismatches:
        first = tuple(int(i) for i in bad.nonzero()[0])
        excess = torch.where(finite, diff / limit.clamp(min=1e-300), torch.tensor(math.inf, dtype=torch.float64))
        excess = torch.where(bad, excess, torch.tensor(-1.0, dtype=torch.float64))
        worst = tuple(int(i) for i in torch.unravel_index(excess.argmax(), a.shape))
        result.first_bad = BadElement(first, float(a[first]), float(e[first]))
        result.worst_bad = BadElement(worst, float(a[worst]), float(e[worst]))
    return result
