"""The dependency direction of ARCHITECTURE.md, enforced on the import statements."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = {
    "baft": set(),
    "analysis": set(),
    "injectors": {"baft"},
    "harness": {"baft", "injectors", "analysis"},
}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names & set(ALLOWED)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_follow_the_floors(package: str) -> None:
    for f in sorted((ROOT / package).rglob("*.py")):
        bad = imported_packages(f) - ALLOWED[package] - {package}
        assert not bad, f"{f.relative_to(ROOT)} imports {sorted(bad)}"
