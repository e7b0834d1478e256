"""The layout of ``traces/``: every module sits in a sub-package named for its stage, each
stage says its job in an opening docstring, and stages import one way (no cycle); inside each
stage and inside ``kda_cli/``, modules import one way too. The layout of ``kernels/``: an op's
modules sit in its sub-package, each saying its job in an opening docstring; at the top only
the modules every op shares (``KERNELS_SHARED``); no import cycle among sub-packages and shared
modules nor among modules; nothing from ``traces/`` or ``kda_cli/``."""

from __future__ import annotations

import ast
from pathlib import Path

TRACES = Path(__file__).resolve().parents[1] / "traces"
KERNELS = TRACES.parent / "kernels"
KERNELS_OPS = ["commit", "context", "plan", "verify"]
"""``kernels/``'s sub-packages, one an op (``context``: the commit of every layer)."""
KERNELS_SHARED = ["buffers.py", "capability.py", "commit_rules.py", "contract.py", "dependent_launch.py",
                  "interpreter.py", "launch.py", "reference.py", "triton_math.py"]
"""What every op shares at ``kernels/``'s top: buffers, the device's capability, the commit
rules and record rows the contract checks, the argument checks, dependent launches, the
interpreter's patch, the decision table, the torch reference and the Triton math."""
KDA_CLI = Path(__file__).resolve().parents[1] / "kda_cli"


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


def module_graph(root: Path, within: str | None = None) -> dict[str, set[str]]:
    """Module -> the other modules under ``root`` it imports (``imported_names``: at any depth,
    a package's ``__init__`` a module of its own), both among those under the dotted name
    ``within`` (default: all of ``root``)."""
    within = within or root.name
    paths = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    paths = {name: path for name, path in paths.items() if name == within or name.startswith(within + ".")}
    return {name: {target for target in imported_names(path, root) if target in paths and target != name}
            for name, path in paths.items()}


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


def test_kernels_keep_ops_in_sub_packages_and_only_shared_modules_at_the_top():
    top = sorted(p.name for p in KERNELS.glob("*.py") if p.name != "__init__.py")
    assert top == KERNELS_SHARED
    ops = sorted(p.name for p in KERNELS.iterdir() if (p / "__init__.py").is_file())
    assert ops == KERNELS_OPS
    assert [path for path in loose_modules(KERNELS) if path not in KERNELS_SHARED] == []
    for op in ops:
        docstring = ast.get_docstring(ast.parse((KERNELS / op / "__init__.py").read_text()))
        assert docstring and len(docstring.split()) >= 10, op


def test_kernels_import_without_a_cycle():
    graph = stage_graph(KERNELS)
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
    modules = module_graph(KERNELS)
    assert find_cycle(modules) is None, " -> ".join(find_cycle(modules))
    for shared in KERNELS_SHARED:
        assert set(graph.get(shared[:-3], ())) <= {name[:-3] for name in KERNELS_SHARED}, shared


def test_kernels_import_nothing_of_traces_or_the_cli():
    for path in sorted(KERNELS.rglob("*.py")):
        outside = sorted(name for name in imported_names(path, KERNELS) if name.split(".")[0] in ("traces", "kda_cli"))
        assert outside == [], f"{path.relative_to(KERNELS)} imports {', '.join(outside)}"


def test_the_module_graph_finds_a_cycle_inside_a_package(tmp_path):
    root = tmp_path / "kernels"
    (root / "op").mkdir(parents=True)
    (root / "__init__.py").write_text("from kernels.op import a\n")
    (root / "op" / "__init__.py").write_text('"""Op."""\n')
    (root / "op" / "a.py").write_text("from kernels.op.b import x\n")
    (root / "op" / "b.py").write_text("from .a import y\n")
    assert find_cycle(stage_graph(root)) is None
    assert find_cycle(module_graph(root)) == ["kernels.op.a", "kernels.op.b", "kernels.op.a"]


def test_kda_cli_modules_import_one_way():
    graph = module_graph(KDA_CLI)
    assert "kda_cli.commands.replay" in graph
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_modules_of_each_stage_import_one_way():
    stages = sorted(p.name for p in TRACES.iterdir() if (p / "__init__.py").is_file())
    for stage in stages:
        graph = module_graph(TRACES, f"traces.{stage}")
        assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_module_graph_finds_a_cycle_through_a_function_level_import(tmp_path):
    root = tmp_path / "kda_cli"
    (root / "commands").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "commands" / "__init__.py").write_text("")
    (root / "commands" / "a.py").write_text("def f():\n    from kda_cli.commands.b import X\n")
    (root / "commands" / "b.py").write_text("from .a import f\nX = 1\n")
    (root / "commands" / "c.py").write_text("from kda_cli.commands import a\n")
    graph = module_graph(root)
    assert graph["kda_cli.commands.c"] == {"kda_cli.commands", "kda_cli.commands.a"}
    assert find_cycle(graph) == ["kda_cli.commands.a", "kda_cli.commands.b", "kda_cli.commands.a"]
    assert find_cycle(module_graph(root, "kda_cli.commands.c")) is None
