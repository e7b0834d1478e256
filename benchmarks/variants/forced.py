"""A pytest plugin that runs the tests under one variant's overrides (its ``patch``, which
``overrides.wrap_api`` puts beside the API), for the whole session:

    KDA_VARIANT=benchmarks/variants/uniform_register_budget.py PYTHONPATH=. \
        python3 -m pytest -p benchmarks.variants.forced -q tests/kernels/test_commit_layers.py

Tests that force a design themselves (``KDA_DESIGN``) keep theirs; a variant's attribute
overrides apply under every design. A design alone needs no variant: ``KDA_DESIGN=OP=DESIGN
python3 -m pytest ...`` runs the tests under it (it fails the tests of the decision table's
own choice: ``-k 'not until_a_layer'`` deselects the one in
tests/kernels/test_commit_layers.py). The header names the variant.
"""

from __future__ import annotations

import os

import pytest

VARIABLE = "KDA_VARIANT"
_active = []


def pytest_report_header(config):
    return f"variant forced: {os.environ.get(VARIABLE) or '(none: set ' + VARIABLE + ')'}"


def pytest_sessionstart(session):
    """Enter the variant's patch; imported here, after the tests' conftest chose the device
    (the kernels must be imported after ``TRITON_INTERPRET`` is set)."""
    path = os.environ.get(VARIABLE)
    if not path:
        raise pytest.UsageError(f"{VARIABLE} must name a variant file (benchmarks/variants/*.py)")
    from traces.impl.loader import ImplError, load_impl

    try:
        variant = load_impl(path, VARIABLE)
    except ImplError as exc:
        raise pytest.UsageError(str(exc)) from None
    if not callable(getattr(variant, "patch", None)):
        raise pytest.UsageError(f"{VARIABLE} {path}: not a variant (no patch: build it with overrides.wrap_api)")
    patch = variant.patch()
    patch.__enter__()
    _active.append(patch)


def pytest_sessionfinish(session):
    while _active:
        _active.pop().__exit__(None, None, None)
