"""Test set-up: CUDA when present, else the Triton interpreter on the CPU; seeds.

The interpreter must be chosen before any kernel module is imported, so it is set here,
at collection time, and nowhere in ``kernels/``. Random inputs take their seeds from
``tests.support.seeds.fresh_seed``: the run's base seed is in the header, the closing summary
(shown under ``-q`` too) and every failure report, and ``KDA_TEST_SEED=N`` replays a
run's inputs. The base seed is put in the environment, so the workers of ``pytest -n N``
(pytest-xdist), started after this file is loaded, draw from the seed the run prints.
"""

import os

import pytest
import torch

from tests.support import seeds

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"
    from kernels.interpreter import skip_repatching_in_helper_calls

    skip_repatching_in_helper_calls()

DEVICE = "cuda" if HAS_CUDA else "cpu"

os.environ[seeds.VARIABLE] = str(seeds.BASE)


def pytest_configure(config):
    """Under the interpreter, its ``overflow encountered in exp`` is hidden in every test. It
    computes ``tl.sigmoid(x)`` as ``1 / (1 + exp(-x))`` in float32 numpy: for a gate far below
    zero (``A * x < -88``) exp overflows to inf and numpy warns, but the result, 0, is the
    sigmoid's IEEE-correct value (a non-finite output would fail the comparisons anyway).
    Compiled kernels never warn; ``kda_cli.runtime.select_device`` hides it for the CLI alike.
    (A filter set at import would not last: pytest imports this file inside its own.)"""
    if not HAS_CUDA:
        config.addinivalue_line("filterwarnings",
                                "ignore:overflow encountered in exp:RuntimeWarning:triton.runtime.interpreter")


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu_only" in item.keywords and not HAS_CUDA:
            item.add_marker(skip)


@pytest.fixture
def device() -> str:
    return DEVICE


def _seed_line() -> str:
    return f"test seeds: {seeds.VARIABLE}={seeds.BASE} (set it to replay this run's random inputs)"


def pytest_report_header(config):
    return _seed_line()


def pytest_terminal_summary(terminalreporter):
    """The seed again at the end, where ``-q`` (which drops the header) shows it too."""
    terminalreporter.write_line(_seed_line())


@pytest.fixture(autouse=True)
def _test_seeds(request):
    seeds.start_test(request.node.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        drawn = ", ".join(map(str, seeds.drawn)) or "none"
        report.sections.append(("seeds", f"{seeds.VARIABLE}={seeds.BASE} reproduces this test's random inputs "
                                         f"(seeds drawn: {drawn})"))
