"""Names a package imports from its modules on first use, so that importing the package does not
import what those modules need (torch)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from importlib import import_module
from typing import Any


def lazy_attributes(package: str, lazy: Mapping[str, Sequence[str]], public: Sequence[str]
                    ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package``: ``lazy`` maps each
    relative module to the names it defines; ``dir()`` lists the ``public`` ones."""
    module_of = {name: module for module, names in lazy.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(module, package), name)

    def __dir__() -> list[str]:
        return sorted(public)

    return __getattr__, __dir__
