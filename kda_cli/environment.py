"""The import names kda installs beside ``kda_cli`` (``kernels``, ``traces``) must resolve to
kda's own folders: another installed package of the same name shadows them, and every
command would then fail with an import error far from the cause."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from kda_cli.runtime import EXIT_RUNTIME, CommandError

DISTRIBUTION = "kda-recoverssm"
PACKAGES = ("kernels", "traces")


def _location(spec) -> Path | None:
    if spec is None:
        return None
    if spec.origin and spec.origin not in ("namespace", "built-in", "frozen"):
        return Path(spec.origin).resolve().parent
    locations = list(spec.submodule_search_locations or ())
    return Path(locations[0]).resolve() if locations else None


def _owners(name: str, found: Path | None) -> list[str]:
    """Installed distributions, other than kda's, that provide the top-level ``name`` from the
    site folder it was ``found`` in."""
    from importlib.metadata import distribution, packages_distributions

    if found is None:
        return []
    candidates = {d for d in packages_distributions().get(name, [])
                  if d.lower().replace("_", "-") != DISTRIBUTION}
    return sorted(d for d in candidates if Path(distribution(d).locate_file("")).resolve() == found.parent)


def check_imports() -> None:
    """Raise ``CommandError`` (one line, exit 3) naming the package that shadows ``kernels`` or
    ``traces`` and the fix; cheap enough for every command (no import of either)."""
    home = Path(__file__).resolve().parent.parent
    for name in PACKAGES:
        found = _location(importlib.util.find_spec(name))
        if found == home / name:
            continue
        owners = _owners(name, found)
        by = f"the installed package {', '.join(owners)}" if owners else str(found) if found else "no package"
        fix = f"pip uninstall {owners[0]}, or " if owners else ""
        raise CommandError(
            f"the import name {name!r} resolves to {by}, not to {DISTRIBUTION}'s {home / name}; "
            f"{fix}install {DISTRIBUTION} into its own environment (python3 -m venv .venv)", EXIT_RUNTIME)
