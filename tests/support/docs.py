"""Reading the docs and the saved results their figures come from."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from support.paths import ROOT

RESULTS = ROOT / "bench" / "results"


def results(name: str) -> Any:
    return json.loads((RESULTS / name).read_text())


@cache
def prose(doc: str) -> str:
    return " ".join((ROOT / doc).read_text().split())


def section(number: int) -> str:
    """One numbered section of docs/benchmarks.md, whitespace collapsed."""
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    start = text.index(f"\n## {number}. ")
    end = text.find("\n## ", start + 1)
    return " ".join(text[start : end if end > 0 else None].split())


def number(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"


def span(values: list[float], digits: int, unit: str = "") -> str:
    """``0.91–1.08 %``: the range of several runs, or one value when they agree."""
    low, high = number(min(values), digits), number(max(values), digits)
    return (low if low == high else f"{low}–{high}") + unit
