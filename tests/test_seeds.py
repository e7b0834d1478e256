"""Test seeds: printed with a failure, and the printed value replays the same inputs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _run(folder: Path, seed: str | None, returncode: int = 1, options: tuple[str, ...] = ()) -> str:
    env = {k: v for k, v in os.environ.items() if k != "KDA_TEST_SEED"}
    if seed is not None:
        env["KDA_TEST_SEED"] = seed
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
                           *options, str(folder / "test_draws.py")], cwd=folder, capture_output=True, text=True,
                          timeout=120, env={**env, "PYTHONPATH": str(REPO)})
    assert done.returncode == returncode, done.stdout + done.stderr
    return done.stdout


def test_a_failure_prints_the_seed_that_replays_it(tmp_path):
    (tmp_path / "test_draws.py").write_text(
        "from tests.support.seeds import fresh_seed\n\n\n"
        "def test_draws():\n"
        "    print('drew', fresh_seed(), fresh_seed())\n"
        "    assert False\n")
    first = _run(tmp_path, None)
    base = re.search(r"KDA_TEST_SEED=(\d+) reproduces this test's random inputs \(seeds drawn: (\d+), (\d+)\)", first)
    assert base, first
    again = _run(tmp_path, base.group(1))
    assert f"drew {base.group(2)} {base.group(3)}" in again
    assert f"KDA_TEST_SEED={base.group(1)} reproduces" in again


def test_a_quiet_passing_run_still_prints_its_seed(tmp_path):
    """``pytest -q`` (the README's command) shows no header: the seed is in the summary."""
    (tmp_path / "test_draws.py").write_text("def test_passes():\n    pass\n")
    out = _run(tmp_path, "12345", returncode=0)
    assert "test seeds: KDA_TEST_SEED=12345 (set it to replay this run's random inputs)" in out.splitlines(), out


def test_the_workers_of_pytest_n_draw_from_the_seed_the_run_prints(tmp_path):
    """Under ``pytest -n 2 --dist worksteal`` (the README's command) each worker draws from the
    base seed of the closing summary, so that seed replays a failure in a run without ``-n``."""
    pytest.importorskip("xdist")
    (tmp_path / "test_draws.py").write_text(
        "import pytest\n"
        "from tests.support.seeds import fresh_seed\n\n\n"
        "@pytest.mark.parametrize('n', range(4))\n"
        "def test_draws(n):\n"
        "    print('drew', n, fresh_seed())\n"
        "    assert False\n")
    out = _run(tmp_path, None, options=("-n", "2", "--dist", "worksteal"))
    base = re.search(r"^test seeds: KDA_TEST_SEED=(\d+) ", out, re.MULTILINE)
    assert base, out
    reported = set(re.findall(r"KDA_TEST_SEED=(\d+) reproduces", out))
    assert reported == {base.group(1)}, out
    drawn = re.findall(r"drew (\d) (\d+)", out)
    assert len(drawn) == 4, out
    again = _run(tmp_path, base.group(1))
    assert sorted(re.findall(r"drew (\d) (\d+)", again)) == sorted(drawn)
