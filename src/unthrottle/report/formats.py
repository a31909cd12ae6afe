"""The formats, registered by name: one small function each, all fed the same
:class:`Report`. A format returns text, or files by relative path (kustomize)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from unthrottle.report.html import MAX_PLOTS, render_html
from unthrottle.report.kustomize import render_kustomize
from unthrottle.report.markdown import render_markdown
from unthrottle.report.model import Report
from unthrottle.report.tabular import render_csv, render_json, render_table, render_yaml

Output = str | dict[str, str]
"""Text, or a directory's files by relative path."""


@dataclass(frozen=True, slots=True)
class RenderOptions:
    """What a front-end may choose about the output (never what it shows)."""

    title: str | None = None
    """The heading of Markdown and HTML; None: the policy's, or ``unthrottle recommend``."""
    width: int = 200
    """The table's width in columns (the terminal's, when there is one)."""
    max_plots: int = MAX_PLOTS
    """Containers over target that get plots in HTML, most harmed first."""


Formatter = Callable[[Report, RenderOptions], Output]

FORMATS: dict[str, Formatter] = {
    "table": lambda r, o: render_table(r, width=o.width),
    "json": lambda r, o: render_json(r),
    "yaml": lambda r, o: render_yaml(r),
    "csv": lambda r, o: render_csv(r),
    "markdown": lambda r, o: render_markdown(r, title=o.title),
    "html": lambda r, o: render_html(r, title=o.title, max_plots=o.max_plots),
    "kustomize": lambda r, o: render_kustomize(r),
}
"""Every format by name, in the order help lists them."""

DIRECTORY_FORMATS = frozenset({"kustomize"})
"""Formats that write a directory, not one file."""


def render(report: Report, fmt: str, options: RenderOptions | None = None) -> Output:
    """The report in a registered format; :class:`KeyError` for an unknown one."""
    return FORMATS[fmt](report, options or RenderOptions())
