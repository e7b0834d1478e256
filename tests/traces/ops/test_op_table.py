"""The op table (``traces.ops``): every op module is in it, in its declared order, and the
stages that read, check, play, record and cut a trace branch on no op name of their own."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import traces.ops
from traces.format import schema
from traces.ops.op import Op
from traces.ops.table import OPS

ROOT = Path(__file__).resolve().parents[3]
TABLE_READERS = ("traces/format", "traces/impl", "traces/replay", "traces/record", "traces/repro", "traces/corpus",
                 "traces/synth", "kda_cli")
"""Where an op is known only through the table."""


def test_the_table_holds_every_op_module_in_order():
    modules = [importlib.import_module(f"traces.ops.{m.name}") for m in pkgutil.iter_modules(traces.ops.__path__)]
    defined = {m.OP.name: m.OP for m in modules if isinstance(getattr(m, "OP", None), Op)}
    assert defined == OPS
    orders = [op.order for op in OPS.values()]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)
    assert schema.OPS == tuple(OPS) and schema.KERNEL_OPS == tuple(n for n, op in OPS.items() if op.api)
    assert schema.INPUTS == {n: dict(op.inputs) for n, op in OPS.items()}


def op_name_branches(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: names`` for each comparison in ``path`` (under ``root``) against a string
    that names an op."""
    def strings(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            for item in node.elts:
                yield from strings(item)

    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare):
            named = sorted({s for side in (node.left, *node.comparators) for s in strings(side)} & set(OPS))
            if named:
                found.append(f"{path.relative_to(root)}:{node.lineno}: {', '.join(named)}")
    return found


def test_no_branch_on_an_op_name_outside_the_table():
    found = [hit for folder in TABLE_READERS for path in sorted((ROOT / folder).rglob("*.py"))
             for hit in op_name_branches(path)]
    assert found == []


def test_the_check_finds_a_branch(tmp_path):
    (tmp_path / "m.py").write_text('def f(op):\n    return op == "verify" or op in ("plan", "other")\n')
    assert op_name_branches(tmp_path / "m.py", tmp_path) == ["m.py:2: verify", "m.py:2: plan"]
