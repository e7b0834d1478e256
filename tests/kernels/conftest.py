"""The kernel tests' fixtures: a test once per design of an op, that design forced."""

from __future__ import annotations

import pytest

import kernels.launch
from tests.support.forced_designs import use_designs


@pytest.fixture(params=kernels.launch.DESIGNS["commit"])
def commit_design(request, monkeypatch):
    use_designs(monkeypatch, commit=request.param)
    return request.param


@pytest.fixture(params=kernels.launch.DESIGNS["verify"])
def verify_design(request, monkeypatch):
    use_designs(monkeypatch, verify=request.param)
    return request.param
