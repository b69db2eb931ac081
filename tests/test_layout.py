"""The shape of the package: no pickle, no import cycle, no oversized function."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1] / "monitor"
MAX_FUNCTION_LINES = 120


def _modules() -> list[Path]:
    return sorted(ROOT.rglob("*.py"))


def test_no_pickle_under_monitor() -> None:
    """State is data (msgspec structs, numpy arrays): a state record can never run code."""
    users = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names] if isinstance(node, ast.Import)
                else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            )  # fmt: skip
            if any(n.split(".")[0] in ("pickle", "cPickle", "dill", "cloudpickle") for n in names):
                users.append(str(path.relative_to(ROOT)))
    assert users == []


def test_no_import_cycle_in_monitor() -> None:
    """Between any two modules of monitor/, imports made at run time go one way.

    (The bank's sibling modules name `BankCusum` in annotations under TYPE_CHECKING: a
    reference for the type checker, not an import.)"""
    graph = grimp.build_graph("monitor", exclude_type_checking_imports=True)
    cycles = [
        (module, imported)
        for module in sorted(graph.modules)
        for imported in sorted(graph.find_modules_directly_imported_by(module))
        if graph.chain_exists(imported=module, importer=imported)
    ]
    assert cycles == []


def test_no_function_under_monitor_is_over_the_limit() -> None:
    """A function that does one job fits on a screen or two; the limit is a backstop."""
    long = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n})")
    assert long == []
