"""The package declares what it imports, and nothing else (pyproject.toml's dependencies)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions

from conftest import ROOT

PACKAGE = ROOT / "operator" / "unthrottle"


def _imported() -> set[str]:
    """Top-level modules the package imports (standard library and itself excluded)."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
    return {
        m
        for m in found
        if m not in sys.stdlib_module_names and m not in {"unthrottle", "__future__"}
    }


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {
        re.split(r"[<>=!~ \[;]", d)[0].lower().replace("_", "-") for d in project["dependencies"]
    }


def test_every_imported_distribution_is_declared_and_every_declared_one_imported() -> None:
    owners = packages_distributions()
    imported = {owners[m][0].lower().replace("_", "-") for m in _imported() if m in owners}
    unknown = {m for m in _imported() if m not in owners}
    assert not unknown, f"imported but not installed: {sorted(unknown)}"
    declared = _declared()
    assert imported - declared == set(), "imported, not declared in pyproject.toml"
    assert declared - imported == set(), "declared in pyproject.toml, never imported"
