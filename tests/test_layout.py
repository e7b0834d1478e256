"""The layout of ``traces/``: every module sits in a sub-package named for its stage, each
stage says its job in an opening docstring, and stages import one way (no cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

TRACES = Path(__file__).resolve().parents[1] / "traces"


def module_name(path: Path, root: Path) -> str:
    """Dotted name of the module at ``path`` under the package directory ``root``."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path, root: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (imports inside functions included),
    relative imports resolved."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            source = ".".join(base + ([node.module] if node.module else []))
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)
    return names


def stage_of(name: str, root: Path) -> str | None:
    """The stage (first component under ``root``) a dotted name lies in; None outside."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == root.name else None


def stage_graph(root: Path) -> dict[str, set[str]]:
    """Stage -> the other stages its modules import."""
    graph: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        own = stage_of(module_name(path, root), root)
        if own is None:
            continue
        targets = {stage_of(name, root) for name in imported_names(path, root)}
        graph.setdefault(own, set()).update(t for t in targets if t is not None and t != own)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or None when it is acyclic."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        for target in sorted(graph.get(node, ())):
            cycle = visit(target, path + [node])
            if cycle:
                return cycle
        done.add(node)
        return None

    for node in sorted(graph):
        cycle = visit(node, [])
        if cycle:
            return cycle
    return None


def loose_modules(root: Path) -> list[str]:
    """Modules under ``root`` outside a stage sub-package (a directory with an ``__init__.py``)."""
    loose = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if relative == Path("__init__.py"):
            continue
        if len(relative.parts) < 2 or not (root / relative.parts[0] / "__init__.py").is_file():
            loose.append(str(relative))
    return loose


def test_every_module_sits_in_a_stage():
    assert loose_modules(TRACES) == []


def test_every_stage_opens_with_a_docstring_of_its_job():
    stages = sorted(p for p in TRACES.iterdir() if (p / "__init__.py").is_file())
    assert [s.name for s in stages] == ["bench", "corpus", "format", "impl", "ops", "record", "replay", "repro",
                                         "synth"]
    for stage in stages:
        docstring = ast.get_docstring(ast.parse((stage / "__init__.py").read_text()))
        assert docstring and len(docstring.split()) >= 10, stage.name


def test_stages_import_one_way():
    graph = stage_graph(TRACES)
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
    assert graph["ops"] == set()
    assert graph["format"] == {"ops"}


def test_the_checks_find_a_cycle_and_a_loose_module(tmp_path):
    root = tmp_path / "traces"
    for stage, source in (("a", "from traces.b.m import x\n"), ("b", "from ..a import m\n")):
        (root / stage).mkdir(parents=True)
        (root / stage / "__init__.py").write_text('"""Stage."""\n')
        (root / stage / "m.py").write_text(source)
    (root / "flat.py").write_text("import traces.a.m\n")
    assert find_cycle(stage_graph(root)) == ["a", "b", "a"]
    assert loose_modules(root) == ["flat.py"]
