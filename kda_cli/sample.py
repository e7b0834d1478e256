"""The Kimi-K3-shaped trace shipped inside the package: what ``kda replay`` and ``kda info``
read when no trace is named."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Optional

SAMPLE = "k3-tp8-sample.safetensors"


def trace_path(trace: Optional[Path]) -> AbstractContextManager[Path]:
    """``trace`` itself, or (``None``) the shipped sample as a file path, for the block."""
    if trace is not None:
        return nullcontext(trace)
    from importlib.resources import as_file, files

    return as_file(files("traces") / "samples" / SAMPLE)
