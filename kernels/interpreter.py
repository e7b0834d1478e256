"""Faster ``@triton.jit`` helper calls under the Triton interpreter (``TRITON_INTERPRET=1``).

Triton 3.6's interpreter makes ``triton.language`` callable from Python by patching its
modules: once per launch (restored after the launch), and again at *every* call of a
``@triton.jit`` helper from inside a kernel, where it walks three modules with
``inspect.getmembers`` and re-installs the same patches (never restored). The kernels call
the shared helpers (``kernels.triton_math``) per token and per block, so on a CPU that
re-patching is most of a replay's time (the shipped sample's replay: 40 s with it, 18 s without).

``skip_repatching_in_helper_calls`` makes a helper call skip the patching when the
enclosing launch has already patched every ``triton.language`` module the helper's globals
hold; any other call (a helper outside a launch, one that sees another module) patches as
before. What runs is unchanged: the same patches are in place, made once. It acts only on
triton 3.6 (the version pinned, whose interpreter it was written against), and only where
the edges that choose the interpreter install it (``kda_cli.runtime.select_device``, the
corpus's CPU workers, the tests' conftest); never in a program ``kda record`` runs.
"""

from __future__ import annotations

import inspect

import triton

REPLACED: dict[tuple[type, str], object] = {}
"""The interpreter's own methods this replaced, by (class, name): what a check of the skip
puts back to compare with."""


def skip_repatching_in_helper_calls() -> bool:
    """Install the skip (idempotent); ``False``, changing nothing, on a triton it was not written for."""
    if REPLACED:
        return True
    if not triton.__version__.startswith("3.6."):
        return False
    from triton.runtime import interpreter

    needed = ("_patch_lang", "GridExecutor", "InterpretedFunction", "InterpreterError")
    if not all(hasattr(interpreter, name) for name in needed):
        return False
    _install(interpreter)
    return True


def _language_modules(fn) -> frozenset[int]:
    """The ids of the ``triton.language`` modules ``fn``'s globals hold (what patching covers)."""
    import triton.language as tl

    return frozenset(id(value) for value in fn.__globals__.values()
                     if inspect.ismodule(value) and value in (tl, tl.core))


def _install(interpreter) -> None:
    launch_call = interpreter.GridExecutor.__call__
    patching_helper_call = interpreter.InterpretedFunction.__call__
    patched: list[set[int]] = []  # per launch in progress, innermost last: the modules patched in it
    helper_modules: dict[object, frozenset[int]] = {}

    def launch(self, *args, **kwargs):
        patched.append(set(_language_modules(self.fn)))
        try:
            return launch_call(self, *args, **kwargs)
        finally:
            patched.pop()

    def helper_call(self, *args, **kwargs):
        modules = helper_modules.get(self.fn)
        if modules is None:
            modules = helper_modules[self.fn] = _language_modules(self.fn)
        if not patched or not modules <= patched[-1]:
            if patched:
                patched[-1] |= modules  # patched first thing in the call below
            return patching_helper_call(self, *args, **kwargs)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    for cls, replacement in ((interpreter.GridExecutor, launch), (interpreter.InterpretedFunction, helper_call)):
        REPLACED[cls, "__call__"] = cls.__call__
        cls.__call__ = replacement
