"""No import cycle within dressage.tq: every import counts, function-level (deferred) ones included;
only imports under ``if TYPE_CHECKING:`` are left out, since they never run."""

from __future__ import annotations

import ast
from pathlib import Path

import dressage.tq

TQ = Path(dressage.tq.__file__).parent
PACKAGE = "dressage.tq"


def _module_name(path: Path) -> str:
    parts = (PACKAGE, *path.relative_to(TQ).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                skipped.update(id(n) for n in ast.walk(stmt))
    return skipped


def _imported(module: str, is_package: bool, tree: ast.AST) -> set[str]:
    """Every module name an import in ``tree`` may refer to (``from a import b`` names ``a`` and ``a.b``)."""
    skipped = _type_checking_only(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            out.add(source)
            out.update(f"{source}.{alias.name}" for alias in node.names)
    return out


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in TQ.rglob("*.py")}
    graph = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        graph[module] = {m for m in _imported(module, path.name == "__init__.py", tree) if m in files} - {module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function():
    tree = ast.parse("def late():\n    from dressage.tq.b import thing\n")
    graph = {"dressage.tq.a": _imported("dressage.tq.a", False, tree) & {"dressage.tq.b"},
             "dressage.tq.b": {"dressage.tq.a"}}
    assert cycles(graph) == [["dressage.tq.a", "dressage.tq.b"]]
    guarded = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dressage.tq.b import thing\n")
    assert _imported("dressage.tq.a", False, guarded) == {"typing", "typing.TYPE_CHECKING"}


def test_no_import_cycle_within_dressage_tq():
    graph = import_graph()
    assert "dressage.tq.directory.controller" in graph and "dressage.tq.deploy.transfer_queue" in graph
    found = cycles(graph)
    detail = "; ".join(" <-> ".join(c) for c in found)
    assert not found, f"import cycles within dressage.tq: {detail}"
