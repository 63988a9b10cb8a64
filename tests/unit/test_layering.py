"""The dependency direction of ARCHITECTURE.md, enforced on the import statements.

Every import counts, also those inside functions (a lazy import is still a dependency, and a lazy
cycle is still a cycle): packages import only the packages below them, the rooms of ``harness``
only the floors below theirs, and no module reaches itself through its imports.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("baft", "analysis", "injectors", "harness")
ALLOWED = {
    "baft": set(),
    "analysis": set(),
    "injectors": {"baft"},
    "harness": {"baft", "injectors", "analysis"},
}
#: The floors of ``harness``, top to bottom (ARCHITECTURE.md). A room imports only rooms on lower
#: floors (and itself); rooms side by side on one floor do not import each other.
HARNESS_FLOORS: tuple[frozenset[str], ...] = (
    frozenset({"cli", "pytest_plugin", "session"}),  # session: the deprecated alias of worker.session
    frozenset({"cluster", "campaign", "bench"}),
    frozenset({"run"}),
    frozenset({"scenario"}),
    frozenset({"worker"}),
    frozenset({"schema", "cliconfig"}),
    frozenset({"errors"}),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(f): f for pkg in PACKAGES for f in sorted((ROOT / pkg).rglob("*.py"))}


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``path`` imports, relative imports resolved, ``from pkg import mod`` counted
    as importing ``pkg.mod`` when that is a module."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            # the longest prefix that is a project module
            parts = t.split(".")
            for n in range(len(parts), 0, -1):
                if ".".join(parts[:n]) in modules:
                    found.add(".".join(parts[:n]))
                    break
    found.discard(name)
    return found


MODULES = all_modules()
GRAPH = {m: imports_of(p, MODULES) for m, p in MODULES.items()}


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_follow_the_floors(package: str) -> None:
    for mod, deps in GRAPH.items():
        if mod.split(".")[0] != package:
            continue
        bad = {d.split(".")[0] for d in deps} - ALLOWED[package] - {package}
        assert not bad, f"{mod} imports {sorted(bad)}"


#: The floors of ``baft``, top to bottom: the public face, the strategies, their config, what the strategies
#: declare without torch (the registry and each strategy's own section, :data:`DECLARED`), the rooms that do the
#: work, what they share, what a checkpoint holds, and the leaves every room may use. A room imports only
#: rooms on lower floors (and itself); the package's own ``__init__`` (the public names, resolved lazily) is
#: on none.
BAFT_FLOORS: tuple[frozenset[str], ...] = (
    frozenset({"checkpointer"}),
    frozenset({"strategies"}),
    frozenset({"config"}),
    frozenset({"strategies:declared"}),
    frozenset({"device"}),
    frozenset({"bubbles", "persist", "store"}),
    frozenset({"mesh", "snapshot"}),
    frozenset({"state"}),
    frozenset({"traits", "_lazy"}),
    frozenset({"components", "errors", "events", "fields", "priority"}),
)


#: ``strategies:declared``: the modules of ``baft.strategies`` the config and the harness read (torch-free): the
#: registry, each strategy package's config and ``__init__``. ``baft.strategies`` itself, like ``baft``, is on no
#: floor: its public names resolve lazily.
DECLARED = re.compile(r"baft\.strategies\.(registry|\w+\.config|sync|async_dcp|checkfreq|baft)")
LAZY_FACES = ("baft.strategies",)


def harness_room(mod: str) -> str:
    """The room of a module of a package: ``harness.run.agent`` -> ``run``; the package itself -> ``""``."""
    parts = mod.split(".")
    if DECLARED.fullmatch(mod):
        return "strategies:declared"
    if mod in LAZY_FACES:
        return ""
    return parts[1] if len(parts) > 1 else ""


FLOORS = {"harness": HARNESS_FLOORS, "baft": BAFT_FLOORS}


def floor_of(room: str, package: str = "harness") -> int:
    for i, floor in enumerate(FLOORS[package]):
        if room in floor:
            return i
    raise AssertionError(f"{package}.{room} is on no floor of {package.upper()}_FLOORS: put it in a room")


@pytest.mark.parametrize(("package", "room"), sorted({(m.split(".")[0], harness_room(m)) for m in MODULES
                                                      if m.split(".")[0] in FLOORS and harness_room(m)}))
def test_rooms_import_only_lower_floors(package: str, room: str) -> None:
    """In ``harness`` and ``baft`` a room imports only rooms on lower floors (the package's own ``__init__``,
    its public names, is on none)."""
    floor = floor_of(room, package)
    for mod, deps in GRAPH.items():
        if not mod.startswith(package + ".") or harness_room(mod) != room:
            continue
        for dep in deps:
            if not dep.startswith(package + ".") or harness_room(dep) in (room, ""):
                continue
            assert floor_of(harness_room(dep), package) > floor, (
                f"{mod} (floor {floor}) imports {dep} (floor {floor_of(harness_room(dep), package)}): "
                "a room imports only the floors below its own")


def test_the_store_room_is_torch_free_and_imports_no_worker_side() -> None:
    """The node store runs without torch: its room imports only the torch-free leaves, the slot file format
    and itself (the floors allow it more: the snapshot room's slots map tensors)."""
    for mod, deps in GRAPH.items():
        if mod.startswith("baft.store"):
            outside = {d for d in deps if d.startswith("baft.") and not d.startswith("baft.store")}
            assert outside <= {"baft.errors", "baft.fields", "baft.priority", "baft._lazy", "baft.snapshot",
                               "baft.snapshot.slotfile"}, (mod, outside)


def test_a_worker_knows_only_its_spec() -> None:
    for mod, deps in GRAPH.items():
        if mod.startswith("harness.worker"):
            assert not {d for d in deps if d.startswith(("harness.run", "harness.cluster"))}, mod


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of size > 1 (and self-loops)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_lazy_ones_included() -> None:
    graph = {m: {d for d in deps if d in GRAPH} for m, deps in GRAPH.items()}
    # a package's __init__ is imported with each of its modules: an edge into it from the top package's modules or
    # from its own (``from baft.persist import storage`` names the sibling module) is not a cycle of ours
    graph = {m: {d for d in deps if MODULES[d].name != "__init__.py" or (d.split(".")[0] != d and not m.startswith(d + "."))}
             for m, deps in graph.items()}
    assert strongly_connected(graph) == []


def test_no_file_over_600_lines() -> None:
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > 600}
    assert not long, long


# each store module alone in a fresh interpreter, too: ``from baft.store import restores`` in the server went
# through the room's lazy names and imported the handler, which imports the server half-made (found in review)
@pytest.mark.parametrize("module", ["baft", "baft.store", "baft.store.config", "baft.store.placement", "baft.snapshot.slotfile",
                                    "baft.store.server", "baft.store.restores", "baft.store.peerlink", "baft.store.handler",
                                    "baft.store.wire", "baft.config", "baft.fields", "baft.strategies.registry",
                                    "baft.strategies.baft.config", "baft.strategies.async_dcp.config",
                                    "baft.traits", "injectors", "harness.scenario", "harness.run.runner",
                                    "harness.run.agent", "harness.campaign.fuzz", "harness.cluster.deploy"])
def test_torch_free_parts_import_without_torch(module: str) -> None:
    """The node store is started per node and waited for before the agents: importing torch there
    cost three seconds of every baft run. The package's names resolve lazily, so ``import baft`` and
    the store's modules stay torch-free. The ``baft`` process itself validates a scenario (the
    strategies' traits, the model presets' sizes) and orchestrates the runs without torch: its
    workers and agents import it, it does not."""
    import subprocess
    import sys

    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_the_package_names_resolve_lazily() -> None:
    import baft

    assert baft.CheckpointConfig.__module__ == "baft.config"
    assert baft.events.__name__ == "baft.events"
    assert set(baft.__all__) <= set(dir(baft))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = baft.nothing
    assert set(baft.__all__) == set(baft._EXPORTS)


def test_no_function_over_80_lines_in_the_library_the_judge_and_the_cli() -> None:
    """A function that long does several things: split where the split reads better (issue 35)."""
    files = [p for pkg in ("baft", "analysis") for p in sorted((ROOT / pkg).rglob("*.py"))] + [ROOT / "harness" / "cli.py"]
    long = {f"{p.relative_to(ROOT)}:{n.name}": n.end_lineno - n.lineno + 1
            for p in files for n in ast.walk(ast.parse(p.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and (n.end_lineno or 0) - n.lineno + 1 > 80}
    assert not long, long
