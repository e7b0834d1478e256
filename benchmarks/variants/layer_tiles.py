"""The one launch of every layer's commit (``kernels.commit_layers``) on tiles other than
the decision table's, for the variants named ``layers_*.py`` in this folder.

``one_launch_tiles`` gives ``wrap_api`` its patch: the one launch's config with the given
state rows a program (``block_v``), warps and register cap (``maxnreg``; ``None``: the
compiler's count), and where ``design`` is given, ``KDA_DESIGN=commit-layers=DESIGN``
(which also forces the one launch where the table would launch a commit a layer). Other ops,
and every batch where the table picks per-layer launches and no design is forced, run as
shipped.
"""

from __future__ import annotations

import contextlib
import dataclasses

from kernels import commit_layers

from benchmarks.variants.overrides import attributes, environment


def one_launch_tiles(block_v: int, num_warps: int, max_registers: int | None, design: str | None = None):
    """The patch: ``commit_layers.commit_config`` replaced by the shipped one with these
    fields, and ``design`` forced if given."""
    shipped = commit_layers.commit_config

    def tiles(*args, **kwargs):
        return dataclasses.replace(shipped(*args, **kwargs), block_v=block_v, num_warps=num_warps,
                                   max_registers=max_registers)

    @contextlib.contextmanager
    def patch():
        forced = environment(KDA_DESIGN=f"commit-layers={design}") if design else contextlib.nullcontext()
        with forced, attributes(**{"commit_layers:commit_config": (commit_layers, tiles)}):
            yield

    return patch
