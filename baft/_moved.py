"""The module paths ``baft`` had before its rooms (issue 35): each still imports, with a warning.

``import baft.wire`` (or ``from baft import wire``) gives the module at its new path, ``baft.store.wire``,
after a :class:`~baft.errors.BaftDeprecationWarning` that names it. The paths that became rooms of the same name
(``baft.store``, ``baft.state``, ``baft.snapshot``, ``baft.persist``) need no alias: each room answers for
the names its old module had (:mod:`baft._lazy`). Kept for one release.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Any

from baft.errors import deprecated

#: Old module path -> new module path.
MOVED: dict[str, str] = {
    "baft.bubble": "baft.strategies.snapshotter",
    "baft.engine": "baft.bubbles.copier",
    "baft.profiler": "baft.bubbles.profiler",
    "baft.planner": "baft.bubbles.planner",
    "baft.idlegate": "baft.bubbles.idlegate",
    "baft.slotfile": "baft.snapshot.slotfile",
    "baft.slotmeta": "baft.snapshot.slotmeta",
    "baft.storeclient": "baft.store.client",
    "baft.storeconfig": "baft.store.config",
    "baft.wire": "baft.store.wire",
    "baft.placement": "baft.store.placement",
    "baft.replstride": "baft.store.stride",
    "baft.linkmeter": "baft.store.linkmeter",
    "baft.traffic": "baft.store.traffic",
    "baft.peerlink": "baft.store.peerlink",
    "baft.peerrounds": "baft.store.peerrounds",
    "baft.slotring": "baft.store.ring",
    "baft.dcpformat": "baft.persist.dcpformat",
    "baft.dcpwrite": "baft.persist.dcpwrite",
    "baft.writerproc": "baft.persist.writer",
    "baft.storage": "baft.persist.storage",
    "baft.background": "baft.persist.background",
    "baft.interval": "baft.persist.interval",
    "baft.codec": "baft.state.codec",
    "baft.layout": "baft.state.layout",
    "baft.topology": "baft.mesh.topology",
    "baft.collective": "baft.mesh.collective",
    "baft.tpshared": "baft.mesh.tpshared",
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path (after every other finder failed) and loads it as the module at its new path."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        # the import machinery's frames are skipped: the warning points at the line that imported the old path
        deprecated(spec.name, new, stacklevel=3)
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__
        return module

    def get_code(self, fullname: str) -> Any:
        """``python -m OLD``: the new module's code, run as ``__main__`` (after the warning)."""
        new = MOVED[fullname]
        deprecated(fullname, new, stacklevel=3)
        spec = importlib.util.find_spec(new)
        if spec is None or spec.loader is None:
            raise ImportError(f"{new} (the new path of {fullname}) is not found")
        return spec.loader.get_code(new)  # type: ignore[attr-defined]

    def exec_module(self, module: ModuleType) -> None:
        """The module at the new path ran already; the import machinery set its ``__spec__`` to the old
        path's: its own goes back."""
        alias = module.__spec__
        if alias is not None:
            module.__spec__ = self._specs.pop(alias.name, alias)


def install() -> None:
    """Put the finder last on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, MovedModules) for f in sys.meta_path):
        sys.meta_path.append(MovedModules())
