"""The docs' figures, held to the saved results they were measured into (and, where it is
cheap, regenerated from the product). They keep the pages honest; they do not test the
product's behaviour, so the run counts them apart."""

from __future__ import annotations

import pytest

_counted = {"docs": 0, "all": 0}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = config.rootpath / "tests" / "docs"
    for item in items:
        if item.path.is_relative_to(here):
            item.add_marker(pytest.mark.docs_figures)
            _counted["docs"] += 1
    _counted["all"] = len(items)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _counted["docs"]:
        terminalreporter.write_line(
            f"docs figures: {_counted['docs']} of the {_counted['all']} tests collected hold "
            "the docs' figures to their results (tests/docs); the rest test behaviour"
        )
