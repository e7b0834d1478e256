"""How a child process ended, in words: ``subprocess`` gives ``-N`` for one killed by signal N."""

from __future__ import annotations

import signal


def how_it_ended(returncode: int) -> str:
    """``exited with status 3`` or, for a negative ``returncode``, ``was killed by SIGKILL``."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"was killed by {name}"


__all__ = ["how_it_ended"]
