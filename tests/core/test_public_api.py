"""Every library package declares its surface explicitly: ``__all__``, the 10-25 names a user
needs, and ``_LAYER_API``, what entmtp's own upper layers and bench scripts import from it
besides. Editors resolve both (plain imports, or a ``TYPE_CHECKING`` branch where the names are
imported on first use), and code outside a package uses nothing else of it."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("core", "treesearch", "model", "runtime", "evaluation", "calibrate")
LAZY = ("model", "runtime", "evaluation", "calibrate")  # their modules import torch
CONSUMERS = (*LIBRARY, "cli", "bench")


def _literal(tree: ast.Module, name: str):
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"no {name}")


def surface(package: str) -> tuple[list[str], list[str]]:
    tree = ast.parse((ROOT / package / "__init__.py").read_text())
    return _literal(tree, "__all__"), _literal(tree, "_LAYER_API")


def declared_imports(package: str) -> dict[str, str]:
    """name -> module of the ``__init__``'s own relative imports (the TYPE_CHECKING branch's for
    lazy packages)."""
    tree = ast.parse((ROOT / package / "__init__.py").read_text())
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            for alias in node.names:
                found[alias.asname or alias.name] = f".{node.module}"
    return found


def package_imports(path: Path) -> list[tuple[str, str]]:
    """(package, name) for every ``from entmtp.<package> import name`` in ``path`` (a private
    module, ``from entmtp.<package> import _module``, is test_public_imports' business)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if len(parts) == 2 and parts[0] == "entmtp" and parts[1] in LIBRARY:
                found += [(parts[1], alias.name) for alias in node.names
                          if not alias.name.startswith("_")]
    return found


def outside_imports() -> dict[str, set[str]]:
    """package -> names that other packages and bench scripts import from it."""
    used: dict[str, set[str]] = {package: set() for package in LIBRARY}
    for consumer in CONSUMERS:
        for path in sorted((ROOT / consumer).rglob("*.py")):
            for package, name in package_imports(path):
                if package != consumer:
                    used[package].add(name)
    return used


@pytest.mark.parametrize("package", LIBRARY)
def test_the_user_api_is_small_and_the_two_lists_do_not_overlap(package):
    user, layer = surface(package)
    assert 10 <= len(user) <= 25, (package, len(user))
    assert len(set(user)) == len(user) and len(set(layer)) == len(layer)
    assert not set(user) & set(layer)


@pytest.mark.parametrize("package", LIBRARY)
def test_editors_see_every_declared_name(package):
    user, layer = surface(package)
    imports = declared_imports(package)
    assert set(imports) == set(user) | set(layer)
    if package in LAZY:
        lazy = _literal(ast.parse((ROOT / package / "__init__.py").read_text()), "_LAZY")
        assert {name: module for module, names in lazy.items() for name in names} == imports


@pytest.mark.parametrize("package", LIBRARY)
def test_every_declared_name_resolves(package):
    module = importlib.import_module(f"entmtp.{package}")
    user, layer = surface(package)
    assert module.__all__ == user
    for name in user + layer:
        assert getattr(module, name) is not None, name


def test_code_outside_a_package_imports_only_its_declared_names():
    offending = []
    for consumer in CONSUMERS:
        for path in sorted((ROOT / consumer).rglob("*.py")):
            for package, name in package_imports(path):
                user, layer = surface(package)
                if package != consumer and name not in user and name not in layer:
                    offending.append(f"{path.relative_to(ROOT)}: entmtp.{package}.{name}")
    assert offending == []


def test_every_layer_name_is_used_above():
    used = outside_imports()
    unused = {package: sorted(set(surface(package)[1]) - used[package]) for package in LIBRARY}
    assert unused == {package: [] for package in LIBRARY}


def test_importing_a_package_imports_no_torch():
    code = ("import sys\n" + "".join(f"import entmtp.{package}\n" for package in LIBRARY)
            + "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', "
              "'transformers')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert loaded == "[]"


def test_the_checks_see_an_undeclared_import(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text("from entmtp.model import load_heads, not_declared\n"
                    "from entmtp.model._heads import x\nfrom .model import y\n"
                    "from entmtp.model import _heads\n")
    assert package_imports(path) == [("model", "load_heads"), ("model", "not_declared")]
