"""Reports people review, rendered from one model of a scan result.

:class:`Report` is built from a :class:`~unthrottle.scan.ScanResult`
(:meth:`Report.from_scan`) or from the JSON document (:meth:`Report.from_json`, a
report ConfigMap's ``report.json``). Renderers are pure: report → text, or files
(kustomize); :data:`FORMATS` registers them by name.
"""

from unthrottle.report.formats import (
    DIRECTORY_FORMATS,
    FORMATS,
    Formatter,
    Output,
    RenderOptions,
    render,
)
from unthrottle.report.html import render_html
from unthrottle.report.kustomize import deployment_patch, render_kustomize
from unthrottle.report.markdown import markdown, render_markdown
from unthrottle.report.model import (
    Change,
    Container,
    Report,
    ReportError,
    Summary,
    Workload,
    window_text,
)

__all__ = [
    "DIRECTORY_FORMATS",
    "FORMATS",
    "Change",
    "Container",
    "Formatter",
    "Output",
    "RenderOptions",
    "Report",
    "ReportError",
    "Summary",
    "Workload",
    "deployment_patch",
    "markdown",
    "render",
    "render_html",
    "render_kustomize",
    "render_markdown",
    "window_text",
]
