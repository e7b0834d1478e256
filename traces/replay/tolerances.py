"""Comparison tolerances, apart from the comparison itself so that command-line parsing
needs no torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    """An element passes when ``|a - b| <= atol + rtol * |b|``."""

    atol: float
    rtol: float


DEFAULT_TOLERANCES = {
    "float64": Tolerance(1e-9, 1e-9),
    "float32": Tolerance(2e-5, 2e-4),
    "float16": Tolerance(2e-3, 2e-3),
    "bfloat16": Tolerance(2e-2, 2e-2),
}
"""Per-dtype defaults for float tensors. Integer tensors and the key/gate records (bit
copies of verify's inputs) are always compared exactly."""

EXACT = Tolerance(0.0, 0.0)
