"""The shipped kernel API, each call made under extra environment variables: the base of the
variant implementations beside it, which ``kda bench --impl triton,benchmarks/variants/NAME.py``
times side by side with the shipped choice.

``KDA_DESIGN`` (``kernels.launch``) forces designs; ``KDA_DEPENDENT_LAUNCH=0``
(``kernels.dependent_launch``) launches in plain stream order. Both are read at each call, so
a CUDA graph captured through a wrapped call holds the variant's kernels.
"""

from __future__ import annotations

import functools
import os

import kernels

OPS = ("verify", "plan", "defer", "plan_deferred", "commit", "flush", "flush_verify")


def _under(env: dict[str, str], fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        before = {name: os.environ.get(name) for name in env}
        os.environ.update(env)
        try:
            return fn(*args, **kwargs)
        finally:
            for name, value in before.items():
                if value is None:
                    del os.environ[name]
                else:
                    os.environ[name] = value
    return call


def api_under(env: dict[str, str]) -> dict[str, object]:
    """``kda_recoverssm_<op>`` of every op, each call made with ``env`` set."""
    return {f"kda_recoverssm_{op}": _under(env, getattr(kernels, f"kda_recoverssm_{op}")) for op in OPS}
