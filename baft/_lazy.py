"""Names a package resolves on first use (PEP 562), so importing it imports none of its modules.

A room of ``baft`` (``baft.store``, ``baft.state``, ...) answers ``from baft.store import Store`` by importing
the module that defines the name only then: the torch-free parts stay torch-free, and a module of the room
that imports a sibling does not import the whole room.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def exports(package: str, names: Mapping[str, str] | None = None,
            sources: tuple[str, ...] = ()) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``names`` maps a name to the submodule (relative to
    ``package``, or absolute) that defines it; a name not listed is looked up in the ``sources`` in
    order (the modules whose names the package answers for, as the module it replaced did)."""
    names = dict(names or {})

    def load(module: str) -> Any:
        return importlib.import_module(module if not module.startswith(".") else package + module)

    def getattr_(name: str) -> Any:
        import sys

        namespace = vars(sys.modules[package])
        if name in names:
            mod = load(names[name])
            value = mod if mod.__name__.rpartition(".")[2] == name and not hasattr(mod, name) else getattr(mod, name)
            namespace[name] = value
            return value
        if not name.startswith("__"):
            for source in sources:
                mod = load(source)
                if hasattr(mod, name):
                    namespace[name] = value = getattr(mod, name)
                    return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def dir_() -> list[str]:
        import sys

        return sorted({*vars(sys.modules[package]), *names})

    return getattr_, dir_
