"""Every property test runs without a deadline, so a loaded machine cannot turn a slow example into
a failure that Hypothesis' database then replays on every later run."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _name(node: ast.expr) -> str:
    func = node.func if isinstance(node, ast.Call) else node
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _property_tests():
    for path in sorted([*(ROOT / "tests").rglob("test_*.py"), *(ROOT / "benchmarks" / "tests").rglob("test_*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    _name(d) == "given" for d in node.decorator_list):
                yield f"{path.relative_to(ROOT)}::{node.name}", node.decorator_list


def test_every_given_has_settings_without_deadline():
    found = dict(_property_tests())
    assert len(found) >= 13
    missing = []
    for name, decorators in found.items():
        deadlines = [kw.value for d in decorators if isinstance(d, ast.Call) and _name(d) == "settings"
                     for kw in d.keywords if kw.arg == "deadline"]
        if not any(isinstance(v, ast.Constant) and v.value is None for v in deadlines):
            missing.append(name)
    assert not missing, f"@settings(deadline=None) missing on: {', '.join(missing)}"
