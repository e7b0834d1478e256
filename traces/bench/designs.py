"""Designs forced for a run's timed calls: ``KDA_DESIGN`` (``kernels.launch``) set while the
rows are timed, restored after, and the designs in force recorded with the run."""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Iterator, Mapping

from traces.bench.config import BenchConfig


@contextlib.contextmanager
def forced_designs(designs: Mapping[str, str]) -> Iterator[dict[str, str]]:
    """Force ``designs`` (op -> a name of ``kernels.launch.DESIGNS[op]``) over those
    ``KDA_DESIGN`` already forces, for the block; yields every design forced in it (op ->
    design, empty when the decision table chooses everywhere). The variable is restored on exit."""
    from kernels.launch import DESIGN_ENV, forced_designs as from_environment

    saved = os.environ.get(DESIGN_ENV)
    forced = {**from_environment(), **designs}
    if designs:
        os.environ[DESIGN_ENV] = ",".join(f"{op}={design}" for op, design in forced.items())
    try:
        yield forced
    finally:
        if saved is None:
            os.environ.pop(DESIGN_ENV, None)
        else:
            os.environ[DESIGN_ENV] = saved


def under_forced_designs(runner):
    """A bench runner ``runner(source..., config, ...) -> BenchRun`` run under
    ``forced_designs(config.designs)``, the designs forced saved as ``workload["designs"]``."""
    @functools.wraps(runner)
    def run(*args, **kwargs):
        config = next(a for a in (*args, *kwargs.values()) if isinstance(a, BenchConfig))
        with forced_designs(config.designs) as designs:
            result = runner(*args, **kwargs)
        result.workload["designs"] = designs
        return result

    return run
