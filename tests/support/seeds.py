"""Seeds of the tests' random inputs: fresh every run, printed on failure, settable.

Each run draws one base seed (or takes ``KDA_TEST_SEED``); a test's seeds come from a
generator seeded by the base seed and the test's id, so ``KDA_TEST_SEED=N pytest ...``
gives every test the inputs it had in the run that printed ``N``, whichever tests run.
"""

from __future__ import annotations

import os
import random

VARIABLE = "KDA_TEST_SEED"


def _base() -> int:
    text = os.environ.get(VARIABLE, "").strip()
    if not text:
        return random.SystemRandom().randrange(1 << 30)
    try:
        return int(text)
    except ValueError:
        raise SystemExit(f"{VARIABLE}={text}: expected an integer") from None


BASE = _base()
_stream = random.Random(BASE)
drawn: list[int] = []
"""The seeds the current test has drawn, for its failure report."""


def start_test(test_id: str) -> None:
    """Seed the generator for the test ``test_id`` (a pytest node id)."""
    global _stream
    _stream = random.Random(f"{BASE}:{test_id}")
    drawn.clear()


def fresh_seed() -> int:
    """A seed for one set of random inputs of the current test."""
    value = _stream.randrange(1 << 30)
    drawn.append(value)
    return value
