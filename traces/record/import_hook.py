"""The import hook of a recording: named modules patched once they have run, before their
importer gets them (``hook_imports``; ``traces.record.patch.install`` patches them for a
recorder)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Callable


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, on_import: Callable[[ModuleType], object]):
        self.loader, self.on_import = loader, on_import

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.on_import(module)

    def __getattr__(self, name: str):
        return getattr(self.loader, name)


class PatchFinder(importlib.abc.MetaPathFinder):
    """Finds the named modules through the other finders; ``on_import(module)`` runs on each
    once it has run."""

    def __init__(self, names: list[str], on_import: Callable[[ModuleType], object]):
        self.names, self.on_import, self._finding = set(names), on_import, False

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.names or self._finding:
            return None
        self._finding = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader, self.on_import)
        return spec


def hook_imports(names: list[str], on_import: Callable[[ModuleType], object]) -> PatchFinder:
    """Run ``on_import(module)`` on each module named in ``names``: at once on those already
    imported, and on the others once they have run, by a ``PatchFinder`` put in front of
    ``sys.meta_path`` (returned)."""
    finder = PatchFinder(names, on_import)
    sys.meta_path.insert(0, finder)
    for name in names:
        if name in sys.modules:
            on_import(sys.modules[name])
    return finder


__all__ = ["PatchFinder", "hook_imports"]
