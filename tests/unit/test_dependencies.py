"""The package declares what it imports, and nothing else (pyproject.toml's dependencies).

The laboratory (``unthrottle_lab``, lab/pyproject.toml: the lab, the simulator, the
launchers of Prometheus and of the Kubernetes control plane that the tests, the demo and the
benchmarks share; the product never imports it) imports what the product and its own
pyproject declare, and the tests what the ``test`` extra adds: a fresh ``make venv`` gets
them all, none only because another distribution happens to need it."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from support.paths import ROOT

PACKAGE = ROOT / "src" / "unthrottle"
LAB = ROOT / "lab" / "src" / "unthrottle_lab"
TESTS = ROOT / "tests"
SCRIPTS = ("tests", "bench", "demo")
"""Folders of modules the tests import by file name (``prom``, ``cluster_query``)."""


def _imported(*, lab: bool = False) -> set[str]:
    """Top-level modules the product imports (standard library and itself excluded), or
    (``lab``) the laboratory's."""
    return _modules(sorted((LAB if lab else PACKAGE).rglob("*.py")))


def _modules(paths: list[Path]) -> set[str]:
    """Top-level modules these files import, the standard library and unthrottle excluded."""
    found = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
    return {
        m
        for m in found
        if m not in sys.stdlib_module_names
        and m not in {"unthrottle", "unthrottle_lab", "__future__"}
    }


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~ \[;]", d)[0].lower().replace("_", "-") for d in requirements}


def _declared(extra: str | None = None, *, lab: bool = False) -> set[str]:
    pyproject = ROOT / "lab" / "pyproject.toml" if lab else ROOT / "pyproject.toml"
    project = tomllib.loads(pyproject.read_text())["project"]
    if extra is not None:
        return _names(project["optional-dependencies"][extra])
    return _names(project["dependencies"])


def test_every_imported_distribution_is_declared_and_every_declared_one_imported() -> None:
    owners = packages_distributions()
    imported = {owners[m][0].lower().replace("_", "-") for m in _imported() if m in owners}
    unknown = {m for m in _imported() if m not in owners}
    assert not unknown, f"imported but not installed: {sorted(unknown)}"
    declared = _declared()
    assert imported - declared == set(), "imported, not declared in pyproject.toml"
    assert declared - imported == set(), "declared in pyproject.toml, never imported"


def test_the_laboratory_imports_only_what_the_product_or_its_own_pyproject_declares() -> None:
    owners = packages_distributions()
    imported = {owners[m][0].lower().replace("_", "-") for m in _imported(lab=True)
                if m in owners}  # fmt: skip
    assert "cryptography" in imported  # the control plane's certificates: the check has teeth
    assert imported - _declared() - _declared(lab=True) == set()
    assert _declared(lab=True) - {"unthrottle"} <= imported, "declared by the lab, never imported"


def test_the_tests_import_only_what_the_product_or_the_test_extra_declares() -> None:
    owners = packages_distributions()
    scripts = {p.stem for folder in SCRIPTS for p in (ROOT / folder).glob("*.py")}
    scripts |= {p.parent.name for p in TESTS.glob("*/__init__.py")}
    modules = _modules(sorted(TESTS.rglob("*.py"))) - scripts
    assert {m for m in modules if m not in owners} == set(), "imported but not installed"
    imported = {owners[m][0].lower().replace("_", "-") for m in modules}
    assert {"aiohttp", "jsonschema"} <= imported  # the fault proxy, the chart's schema
    assert imported - _declared() - _declared("test") - _declared(lab=True) == set()
