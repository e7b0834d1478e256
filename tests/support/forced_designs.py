"""The design every call of an op runs, forced for a test (``KDA_DESIGN``, ``kernels.launch``)."""

from __future__ import annotations

import kernels.launch


def use_designs(monkeypatch, **designs: str) -> None:
    """Run every call of each op through the design named for it, whatever the batch
    (``KDA_DESIGN``, ``kernels.launch``): ``use_designs(monkeypatch, verify="one-pass")``; an
    op's name with ``_`` for ``-``."""
    forced = ",".join(f"{op.replace('_', '-')}={design}" for op, design in designs.items())
    monkeypatch.setenv(kernels.launch.DESIGN_ENV, forced)
    assert kernels.launch.forced_designs() == {op.replace("_", "-"): design for op, design in designs.items()}
