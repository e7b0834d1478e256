"""Build an implementation module that runs the shipped kernels with some launch choices
overridden, for side-by-side timing: ``kda bench --impl triton,benchmarks/variants/NAME.py``.

``wrap_api(namespace, patch)`` fills ``namespace`` (a variant file's globals) with the kernel
API and the commit context, each function (and ``commit``) running inside ``patch()``, a
context manager that sets and restores what it overrides: a switch of the environment
(``environment``: ``KDA_DEPENDENT_LAUNCH=0``, plain stream order) or, for a choice that no
switch reaches, names in a module (``attributes``). A design of ``kernels.launch.DESIGNS``
needs no variant: ``kda bench --design OP=DESIGN`` forces it for a run. Import it with the
repository root on ``sys.path`` (``PYTHONPATH=.``).
"""

from __future__ import annotations

import contextlib
import functools
import os

import kernels

API = ("kda_recoverssm_verify", "kda_recoverssm_plan", "kda_recoverssm_defer", "kda_recoverssm_commit",
       "kda_recoverssm_flush", "kda_recoverssm_flush_verify", "kda_recoverssm_plan_deferred",
       "kda_recoverssm_commit_layers")
BUFFERS = ("CommitPlan", "KDARecoverSSMRecords", "NULL_BLOCK_ID", "allocate_records", "LayerBuffers", "LayerTables")


@contextlib.contextmanager
def attributes(**targets):
    """Set ``module.name`` for each ``(module, name) -> value`` given as
    ``{"module:name": (module, value)}``; restore them on exit."""
    saved = {key: getattr(module, key.split(":")[1]) for key, (module, _) in targets.items()}
    for key, (module, value) in targets.items():
        setattr(module, key.split(":")[1], value)
    try:
        yield
    finally:
        for key, (module, _) in targets.items():
            setattr(module, key.split(":")[1], saved[key])


@contextlib.contextmanager
def environment(**values: str):
    """Set the environment variables ``values``; restore them on exit."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def wrap_api(namespace: dict, patch) -> None:
    """Put the kernel API into ``namespace``, every function called under ``patch()``, and
    ``patch`` itself (``benchmarks/variants/forced.py`` runs the tests under it)."""
    def under_patch(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            with patch():
                return fn(*args, **kwargs)
        return call

    class KDARecoverSSMCommitContext(kernels.KDARecoverSSMCommitContext):
        """kda's commit context, each ``commit`` under ``patch()``."""

        commit = under_patch(kernels.KDARecoverSSMCommitContext.commit)

    for name in API:
        namespace[name] = under_patch(getattr(kernels, name))
    for name in BUFFERS:
        namespace[name] = getattr(kernels, name)
    namespace["KDARecoverSSMCommitContext"] = KDARecoverSSMCommitContext
    namespace["patch"] = patch
