"""Unit tests: no root, no Go, no server; `make unit` runs them alone, in well under two
minutes. A test here that asks for the kernel, a slow lab run or a cluster is misplaced:
collection fails and names it."""

from __future__ import annotations

import pytest

NEEDS_MORE = ("kernel", "slow", "cluster")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = config.rootpath / "tests" / "unit"
    misplaced = [item.nodeid for item in items if item.path.is_relative_to(here)
                 and any(item.get_closest_marker(m) for m in NEEDS_MORE)]  # fmt: skip
    if misplaced:
        raise pytest.UsageError("unit tests that need more than a unit test may: "
                                + ", ".join(misplaced))  # fmt: skip
