"""The package's public names resolve, its import graph has no cycle, and no layer imports one above it."""

import ast
import pathlib
import subprocess
import sys
from collections import defaultdict

import dressage


def test_every_public_name_resolves():
    for name in dressage.__all__:
        assert getattr(dressage, name) is not None


def test_rollout_layer_imports_no_transport_stack():
    code = ("import sys, dressage.rollout, dressage.train.reader; "
            "print(sorted(m for m in ('zmq', 'fastapi', 'httpx', 'ray', 'dressage.tq') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


SRC = pathlib.Path(dressage.__file__).resolve().parent
BENCH_SRC = SRC.parents[1] / "benchmarks" / "src" / "dressage_bench"


def test_testing_kit_imports_nothing_above_the_transfer_queue():
    code = ("import sys, dressage.testing.faults, dressage.testing.wirefuzz; "
            "print(sorted(m for m in ('dressage.proxy', 'dressage.rollout', 'dressage.train', 'dressage.harness.run', "
            "'pytest', 'dressage_bench') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"   # fault injection and the fuzzer need neither pytest nor the upper layers


def test_the_product_does_not_import_the_benchmarks():
    for path in SRC.rglob("*.py"):
        assert "dressage_bench" not in path.read_text(), path


def test_missing_extra_hint_in_a_bare_install():
    # A real run where fastapi cannot be imported: the Proxy command says which extra to install.
    code = ("import sys; sys.modules['fastapi'] = None; from dressage.cli import main; "
            "sys.exit(main(['proxy', 'serve', '--engine-url', 'http://127.0.0.1:9']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().endswith("pip install 'dressage[server]'"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_version_flag_prints_the_installed_version():
    from importlib.metadata import version

    proc = subprocess.run([sys.executable, "-m", "dressage", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == f"dressage {version('dressage')}"


# The import graph of src/: every ``import`` and ``from ... import`` of a dressage module, at module level
# and inside functions (a deferred import still ties the two modules), except those under
# ``if TYPE_CHECKING:``, which never run. An import names the module it loads (``from dressage.tq import
# FieldRef`` is an edge to the package ``dressage.tq``, ``from dressage.tq import refs`` one to
# ``dressage.fields.refs``); the parent packages Python also runs are not edges of their own.

def _modules() -> dict[str, tuple[pathlib.Path, bool]]:
    found = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return hidden


def _import_graph() -> dict[str, set[str]]:
    modules = _modules()

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = defaultdict(set)
    for name, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        hidden = _type_checking_nodes(tree)
        package = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in hidden:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1])
                    base = f"{base}.{node.module}" if node.module else base
                else:
                    base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                if target == "dressage" or target.startswith("dressage."):
                    found = known(target)
                    if found is not None and found != name:
                        graph[name].add(found)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for succ in edges:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph.get(succ, ())))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(component)
    return components


def test_the_import_graph_of_src_has_no_cycle():
    assert [sorted(c) for c in _cycles(_import_graph())] == []


def test_the_cycle_finder_sees_deferred_imports_and_skips_type_checking_ones():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import dressage.proxy\n"
                     "def f():\n    import dressage.tq\n")
    hidden = _type_checking_nodes(tree)
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import) and id(n) not in hidden]
    assert [a.name for n in imports for a in n.names] == ["dressage.tq"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


# Bottom to top. A module may import its own package and any package of a lower layer; packages that
# share a layer are siblings and import none of each other (the trainer does not import the Proxy, the
# engine does not import the trainer). ``dressage.harness`` (what ``dressage run`` needs without a GPU)
# sits above the whole product, so nothing the product ships depends on it.
LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(layer) for layer in (
    {"errors"},
    {"units", "_lazy", "flags", "serving", "observe"},
    {"fields"},
    {"trajectory"},
    {"tokenizer"},
    {"tq"},
    {"dataplane"},
    {"rollout"},
    {"engine", "proxy", "train", "capacity", "agents"},
    {"integrations", "testing"},
    {"export"},
    {"harness"},
    {"cli"},
    {"__main__", ""},   # "" is the root package, dressage/__init__.py
))

def _package(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def _layer(module: str) -> int:
    package = _package(module)
    for i, layer in enumerate(LAYERS):
        if package in layer:
            return i
    raise AssertionError(f"{module}: package {package!r} is in no layer of LAYERS")


def test_no_layer_imports_a_higher_one_or_a_sibling():
    upward = []
    for importer, imported in sorted(_import_graph().items()):
        for target in sorted(imported):
            same_package = _package(importer) == _package(target)
            if not same_package and _layer(target) >= _layer(importer):
                upward.append(f"{importer} -> {target}")
    assert upward == []


def test_every_package_of_src_has_a_layer():
    assert {_package(m) for m in _modules()} <= set().union(*LAYERS)
    for module in _modules():
        _layer(module)
