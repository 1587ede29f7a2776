"""The packages form layers that import one way, and no module imports itself back.

core -> treesearch -> model -> runtime -> evaluation -> calibrate -> cli: a package may import
only packages to its left. Imports inside functions count as much as module-level ones (they run
as soon as the function does); imports under ``if TYPE_CHECKING:`` do not (they never run).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("core", "treesearch", "model", "runtime", "evaluation", "calibrate", "cli")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["entmtp", *parts])


def _runs(node: ast.AST) -> bool:
    """False for ``if TYPE_CHECKING:`` blocks."""
    if isinstance(node, ast.If):
        test = node.test
        name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
        return name != "TYPE_CHECKING"
    return True


def _imports(tree: ast.AST) -> Iterable[ast.Import | ast.ImportFrom]:
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(child for child in ast.iter_child_nodes(node) if _runs(child))


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    """Module -> the entmtp modules it imports (``from pkg import name`` names the module
    ``pkg.name`` when there is one, else the package)."""
    paths = {module_name(root, path): path
             for package in packages if (root / package).is_dir()
             for path in sorted((root / package).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                targets.add(submodule if submodule in paths else source)
        graph[name] = {t for t in targets if t in paths and t != name}
    return graph


def layer_violations(graph: dict[str, set[str]], layers: tuple[str, ...]) -> list[str]:
    """``a -> b`` for every import of a package at or right of the importer's own layer."""
    def layer(module: str) -> int:
        return layers.index(module.split(".")[1])

    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                  if layer(b) > layer(a))


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
        for w in sorted(graph.get(v, ())):
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
    return sorted(found)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(ROOT, LAYERS)


def test_packages_import_only_the_layers_below_them(graph):
    assert layer_violations(graph, LAYERS) == []


def test_no_module_import_cycles(graph):
    assert cycles(graph) == []


def test_every_package_names_its_layer():
    for package in LAYERS:
        doc = ast.get_docstring(ast.parse((ROOT / package / "__init__.py").read_text())) or ""
        assert doc.startswith(f"entmtp.{package}:"), package
        below = LAYERS[: LAYERS.index(package)]
        assert ("Depends on " + (", ".join(below) if below else "nothing")) in " ".join(
            doc.split()), package


def test_the_graph_sees_every_kind_of_import(tmp_path):
    (tmp_path / "low").mkdir()
    (tmp_path / "high").mkdir()
    (tmp_path / "low" / "__init__.py").write_text("")
    (tmp_path / "high" / "__init__.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._b import B\n")
    (tmp_path / "low" / "_a.py").write_text("def f():\n    from entmtp.high import _b\n")
    (tmp_path / "low" / "_c.py").write_text("from . import _d\n")
    (tmp_path / "low" / "_d.py").write_text("import entmtp.low._c\n")
    (tmp_path / "high" / "_b.py").write_text("from ..low._a import f\nfrom entmtp.low import x\n")
    found = import_graph(tmp_path, ("low", "high"))
    assert found == {
        "entmtp.low": set(),
        "entmtp.high": set(),
        "entmtp.low._a": {"entmtp.high._b"},
        "entmtp.low._c": {"entmtp.low._d"},
        "entmtp.low._d": {"entmtp.low._c"},
        "entmtp.high._b": {"entmtp.low._a", "entmtp.low"},
    }
    assert layer_violations(found, ("low", "high")) == ["entmtp.low._a -> entmtp.high._b"]
    assert cycles(found) == [["entmtp.high._b", "entmtp.low._a"],
                             ["entmtp.low._c", "entmtp.low._d"]]
