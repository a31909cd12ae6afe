"""The tests' own layout (STYLE rule 22): every test module is in an area folder, and no
test module imports another test module or a conftest; what tests share is a fixture in
their area's conftest.py (or tests/conftest.py) or a module in tests/support."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
MODULES = sorted(TESTS.rglob("*.py"))


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            if node.module == "support" or node.level:
                names |= {alias.name for alias in node.names}
    return names


def test_no_test_module_sits_directly_in_tests() -> None:
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == []


def test_no_module_of_the_tests_imports_a_test_module_or_conftest() -> None:
    wrong = {}
    for path in MODULES:
        names = {name for name in imported(path) if name.rpartition(".")[2].startswith("test_")
                 or name.rpartition(".")[2] == "conftest"}  # fmt: skip
        if names:
            wrong[str(path.relative_to(TESTS))] = sorted(names)
    assert not wrong, f"share through tests/support or a fixture, not by importing: {wrong}"


def test_support_holds_no_test_module() -> None:
    assert sorted(p.name for p in (TESTS / "support").glob("test_*.py")) == []
