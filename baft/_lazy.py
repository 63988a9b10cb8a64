"""Names a package resolves on first use (PEP 562), so importing it imports none of its modules.

A room of ``baft`` (``baft.store``, ``baft.state``, ...) answers ``from baft.store import Store`` by importing
the module that defines the name only then: the torch-free parts stay torch-free, and a module of the room
that imports a sibling does not import the whole room. Names that moved or were renamed resolve too, with a
:class:`~baft.errors.BaftDeprecationWarning` that names the new path (:mod:`baft._moved`).
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from baft.errors import deprecated

#: A name's new home: (module, name there).
Renamed = Mapping[str, tuple[str, str]]


def exports(package: str, names: Mapping[str, str] | None = None, sources: tuple[str, ...] = (),
            renamed: Renamed | None = None) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``names`` maps a name to the submodule (relative to
    ``package``, or absolute) that defines it; a name not listed is looked up in the ``sources`` in
    order (the modules whose names the package answers for, as the module it replaced did); ``renamed``
    maps an old name to its new (module, name), with a deprecation warning."""
    names = dict(names or {})
    renamed = dict(renamed or {})

    def load(module: str) -> Any:
        return importlib.import_module(module if not module.startswith(".") else package + module)

    def getattr_(name: str) -> Any:
        import sys

        namespace = vars(sys.modules[package])
        if name in renamed:
            module, new = renamed[name]
            deprecated(f"{package}.{name}", f"{module}.{new}")
            namespace[name] = value = getattr(load(module), new)  # warned once (``from x import`` asks twice)
            return value
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
