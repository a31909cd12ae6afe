"""Reports people review, rendered from a scan result. Renderers are pure: result → text."""

from unthrottle.report.markdown import markdown

__all__ = ["markdown"]
