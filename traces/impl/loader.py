"""Which implementation of the kernel API a replay runs (``kda replay --impl``).

``triton`` is the ``kernels`` package, ``reference`` is ``kernels.reference``; anything
else is an importable module name or a path to a ``.py`` file exposing the same five
functions, or only the documented surface (``traces.impl.surface.SURFACE``: verify, the records
type and the two raw kernels), in which case the ops it lacks run through kda's kernels.
The buffer API (``KDARecoverSSMRecords``, ``CommitPlan``, ``allocate_records``) is the
module's own when it defines it, else that of ``kernels.buffers``.

One import rule for every module named on the command line: the current folder is
importable, as under ``python -m``. ``--impl`` is imported with it at the end of
``sys.path`` (so that it shadows no installed package); a program recorded with ``--patch``
gets it on its ``PYTHONPATH`` (``traces.record.run.child_env``).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from traces.impl.release import RELEASE_SURFACE, ReleaseImpl, has_release_surface
from traces.impl.surface import SURFACE, SurfaceImpl, has_surface
from traces.ops.table import API


BUILT_IN = ("triton", "reference")
"""The implementations named by a word: kda's kernels and its torch reference."""


class ImplError(ValueError):
    """The requested implementation cannot be loaded or lacks part of the API."""


BUFFER_API = ("KDARecoverSSMRecords", "CommitPlan", "allocate_records", "NULL_BLOCK_ID")


def load_impl(spec: str, option: str = "--impl") -> ModuleType | SurfaceImpl | ReleaseImpl:
    """Import the implementation named by ``spec`` and return its module, or a
    ``SurfaceImpl`` over it when it has the documented surface but not the five functions, or
    a ``ReleaseImpl`` when it has the released engine's stock surface.

    The result exposes the five ``API`` functions and the ``BUFFER_API`` names (filled in
    from ``kernels.buffers`` where the module does not define them). Raises ``ImplError``
    when it cannot be imported or has neither, its message starting with ``option`` (the
    command-line option that named it). Import the kernels only after the device is chosen
    (``TRITON_INTERPRET`` on a CPU).
    """
    if spec == "triton":
        module = importlib.import_module("kernels")
    elif spec == "reference":
        module = importlib.import_module("kernels.reference")
    elif names_a_file(spec):
        module = _load_file(Path(spec), option)
    else:
        if os.getcwd() not in sys.path:
            sys.path.append(os.getcwd())  # the current folder, importable as under ``python -m``
        try:
            module = importlib.import_module(spec)
        except ImportError as exc:
            close = difflib.get_close_matches(spec, BUILT_IN, n=1) if getattr(exc, "name", None) == spec else []
            then = f"did you mean {close[0]}?" if close else "expected triton, reference, a module name or a .py file"
            raise ImplError(f"{option} {spec}: cannot import it ({exc}); {then}") from None
        except Exception as exc:
            raise ImplError(f"{option} {spec}: importing it failed: {type(exc).__name__}: {exc}") from None
    missing = [fn for fn in API.values() if not callable(getattr(module, fn, None))]
    if missing and has_surface(module):
        return SurfaceImpl(module, spec)
    if missing and has_release_surface(module):
        return ReleaseImpl(module, spec)
    if missing:
        lacks = [name for name in SURFACE if not hasattr(module, name)]
        release = [name for name in RELEASE_SURFACE if not hasattr(module, name)] or [
            "kda_recoverssm_verify without record_indices and a commit context whose plan is its own columns"]
        raise ImplError(f"{option} {spec}: the module lacks {', '.join(missing)} (the five-function API), "
                        f"or {', '.join(lacks)} (the documented surface), or {', '.join(release)} (the released "
                        "stock surface)")
    from kernels import buffers

    for name in BUFFER_API:
        if not hasattr(module, name):
            setattr(module, name, getattr(buffers, name))
    return module


def op_routes(impl, name: str) -> dict[str, str]:
    """Op -> the implementation it runs through: ``impl.routes`` for a ``SurfaceImpl`` or a
    ``ReleaseImpl``, else ``name`` for every op."""
    routes = getattr(impl, "routes", None)
    return dict(routes) if isinstance(routes, dict) else {op: name for op in API}


def names_a_file(spec: str) -> bool:
    """Whether ``spec`` names a ``.py`` file rather than a module."""
    return spec.endswith(".py") or "/" in spec or "\\" in spec


def _load_file(path: Path, option: str) -> ModuleType:
    if not path.is_file():
        raise ImplError(f"{option} {path}: no such file")
    name = f"kda_impl_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImplError(f"{option} {path}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ImplError(f"{option} {path}: importing it failed: {type(exc).__name__}: {exc}") from None
    return module
