"""The one vocabulary of float dtype names that every option accepts: the trace format's
names (``bfloat16``, ``float16``, ``float32``, ``float64``) and their short forms (``bf16``,
``fp16``, ``fp32``, ``fp64``). Torch-free, so options are checked before any heavy import."""

from __future__ import annotations

from typing import Iterable

SHORT_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}
"""Each float dtype's name, as the trace format and torch write it, -> its short form."""


def dtype_name(text: str) -> str | None:
    """The full name of the float dtype ``text`` names (full or short), or None for none."""
    if text in SHORT_NAMES:
        return text
    return next((name for name, short in SHORT_NAMES.items() if short == text), None)


def spelled(names: Iterable[str]) -> str:
    """``bfloat16 (bf16), float32 (fp32)``: what an error lists as accepted."""
    return ", ".join(f"{name} ({SHORT_NAMES[name]})" for name in names)


__all__ = ["SHORT_NAMES", "dtype_name", "spelled"]
