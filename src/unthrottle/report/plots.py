"""The report's plots, drawn with matplotlib's SVG backend and returned as inline SVG.

Two pictures per container over target:

- **demand**: how many 100 ms windows wanted how much CPU (the agent's histogram, log
  scale, so the rare bursts that cause throttling show), with today's limit, the
  recommended limit and the recommended limit plus its burst drawn on it: windows right
  of today's line are the throttled ones. Without a histogram (a report read back from
  JSON that lacks one) the demand's p50 / p99 / largest window stand in for it.
- **throttling over the window**, when the report carries the series;
- **CPU used over the window** (mean per pod and the busiest pod, from cAdvisor's
  counters) against today's limit and the recommended one, with words on why the
  recommendation sits above the line: samples 15–60 s apart average sub-second bursts away;
- **before and after a change Apply made**: the throttle ratio with the change marked.

Every SVG gets a ``<title>`` and ``<desc>`` (its text alternative), ``role="img"``, and
ids prefixed so that many plots can share one HTML page. No text from the cluster is
given to matplotlib (no mathtext, no markup): names go only into the escaped title and
description. Pure: figures are drawn in memory, never through pyplot's global state.
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass
from typing import Any, Literal

import matplotlib as mpl
from markupsafe import Markup, escape
from matplotlib.axes import Axes
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure
from matplotlib.ticker import FixedFormatter, FixedLocator, NullLocator

from unthrottle.report.model import Container, Point

# Okabe-Ito hues, darkened where needed so that every colour drawn keeps ≥ 4.5:1 against
# the white page (WCAG's ratio for text; lines and bars are held to it too)
TODAY = "#B34700"  # vermillion (5.5:1): today's limit, the windows above it, before a change
RECOMMENDED = "#0072B2"  # blue (5.2:1): the recommendation, and after a change
BELOW = "#007A5E"  # bluish green (5.3:1): windows that fit under today's limit; mean usage
INK = "#222222"
_RC: dict[Any, Any] = {
    "svg.fonttype": "none",  # text stays text: smaller, selectable, no embedded glyph paths
    "svg.hashsalt": "unthrottle",  # clip-path ids do not change from run to run
    "font.size": 9,
    "axes.edgecolor": INK,
    "axes.labelcolor": INK,
    "xtick.color": INK,
    "ytick.color": INK,
    "text.color": INK,
}
_SIZE = (6.4, 2.7)  # inches; the SVG scales to the page, this only sets proportions
_METADATA = {"Date": None, "Creator": None, "Format": None, "Type": None}


@dataclass(frozen=True, slots=True)
class Plot:
    """One inline SVG and its text alternative."""

    svg: Markup
    title: str
    alt: str


def _svg(fig: Figure, prefix: str, title: str, alt: str) -> Plot:
    FigureCanvasSVG(fig)
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata=_METADATA)
    raw = buf.getvalue()
    raw = raw[raw.index("<svg") :]
    raw = re.sub(r"<metadata>.*?</metadata>\s*", "", raw, flags=re.S)
    raw = re.sub(r'<style type="text/css">.*?</style>\s*', "", raw, flags=re.S)
    raw = re.sub(r'\bid="([^"]+)"', rf'id="{prefix}-\1"', raw)
    raw = re.sub(r"url\(#([^)]+)\)", rf"url(#{prefix}-\1)", raw)
    raw = re.sub(r'href="#([^"]+)"', rf'href="#{prefix}-\1"', raw)
    raw = re.sub(r'\s(width|height)="[^"]*pt"', "", raw, count=2)
    head_end = raw.index(">") + 1
    opening = raw[: head_end - 1] + (
        f' class="plot" role="img" aria-labelledby="{prefix}-title {prefix}-desc">'
    )
    labelled = (f'<title id="{prefix}-title">{escape(title)}</title>'
                f'<desc id="{prefix}-desc">{escape(alt)}</desc>')  # fmt: skip
    return Plot(Markup(opening + labelled + raw[head_end:]), title, alt)


def _limits(ax: Axes, c: Container) -> None:
    """Today's limit, the recommended one and the recommended one plus its burst."""
    now = c.current.limit_millicores
    if now is not None:
        ax.axvline(now / 1000, color=TODAY, linestyle="--", linewidth=1.6,
                   label=f"today's limit {now / 1000:g} cores")  # fmt: skip
    rec = c.recommendation
    if rec is not None and rec.limit_millicores is not None:
        ax.axvline(rec.limit_millicores / 1000, color=RECOMMENDED, linewidth=1.8,
                   label=f"recommended {rec.limit_millicores / 1000:g} cores")  # fmt: skip
        if rec.burst_us:
            peak = rec.limit_millicores / 1000 + rec.burst_us / c.period_us
            ax.axvline(peak, color=RECOMMENDED, linestyle=":", linewidth=1.8,
                       label=f"… + {rec.burst_us / 1000:g} ms burst: {peak:g} cores")  # fmt: skip


def _log_percent(ax: Axes, low: float) -> None:
    """A log y axis of percentages with plain decade labels (no mathtext, no minor ticks:
    they cost more than the rest of the plot)."""
    ax.set_yscale("log")
    ax.set_ylim(low, 100)
    decades = [10.0**k for k in range(math.floor(math.log10(low)), 3)]
    ax.yaxis.set_major_locator(FixedLocator(decades))
    ax.yaxis.set_major_formatter(FixedFormatter([f"{d:g}" for d in decades]))
    ax.yaxis.set_minor_locator(NullLocator())


def _right_edge(c: Container, highest: float) -> float:
    marks = [highest]
    if c.current.limit_millicores is not None:
        marks.append(c.current.limit_millicores / 1000)
    rec = c.recommendation
    if rec is not None and rec.limit_millicores is not None:
        marks.append(rec.limit_millicores / 1000 + rec.burst_us / c.period_us)
    return max(marks) * 1.08 or 1.0


def demand_plot(c: Container, *, prefix: str, title: str, alt: str) -> Plot | None:
    """The distribution of per-window demand with the quotas on it; None without demand."""
    shares = [s for s in c.shares() if s[2] > 0]
    if not shares and c.demand is None:
        return None
    with mpl.rc_context(_RC):
        fig = Figure(figsize=_SIZE)
        fig.subplots_adjust(left=0.1, right=0.98, top=0.95, bottom=0.17)
        ax = fig.add_subplot()
        now = c.current.limit_millicores
        if shares:
            over = [now is not None and low >= now / 1000 for low, _, _ in shares]
            ax.bar([low for low, _, _ in shares], [share * 100 for _, _, share in shares],
                   width=[high - low for low, high, _ in shares], align="edge",
                   color=[TODAY if o else BELOW for o in over], edgecolor="white",
                   linewidth=0.5)  # fmt: skip
            _log_percent(ax, min(s for _, _, s in shares) * 100 / 2)
            ax.set_ylabel("windows (%)")
            highest = shares[-1][1]
        else:
            assert c.demand is not None
            d = c.demand
            marks = (d.p50_millicores, d.p99_millicores, d.max_millicores)
            ax.hlines(0.5, marks[0] / 1000, marks[2] / 1000, color=BELOW, linewidth=6)
            ax.plot([m / 1000 for m in marks], [0.5] * 3, "o", color=INK)
            for name, m in zip(("p50", "p99", "max"), marks, strict=True):
                ax.annotate(name, (m / 1000, 0.5), xytext=(0, 8), textcoords="offset points",
                            ha="center")  # fmt: skip
            ax.set_ylim(0, 1)
            ax.set_yticks([])
            highest = marks[2] / 1000
        _limits(ax, c)
        ax.set_xlim(0, _right_edge(c, highest))
        ax.set_xlabel("CPU wanted in a 100 ms window (cores)")
        ax.legend(loc="upper right", fontsize=8, frameon=True, framealpha=0.9)
        ax.grid(axis="y", color="#dddddd", linewidth=0.5)
        return _svg(fig, prefix, title, alt)


def throttle_plot(c: Container, target: float, *, prefix: str, title: str,
                  alt: str) -> Plot | None:  # fmt: skip
    """The throttle ratio over the window, with the target; None without the series."""
    points = c.throttle_series
    if len(points) < 2:
        return None
    with mpl.rc_context(_RC):
        fig = Figure(figsize=(_SIZE[0], _SIZE[1] * 0.8))
        fig.subplots_adjust(left=0.1, right=0.98, top=0.93, bottom=0.2)
        ax = fig.add_subplot()
        end = points[-1].t
        ax.plot([(p.t - end) / 3600 for p in points], [p.ratio * 100 for p in points],
                color=TODAY, linewidth=1.4, label="periods throttled")  # fmt: skip
        ax.axhline(target * 100, color=RECOMMENDED, linestyle="--", linewidth=1.2,
                   label=f"target {target * 100:g} %")  # fmt: skip
        ax.set_ylim(bottom=0)
        _over_time(ax, "hours before the end of the window", "throttled (%)", "upper left")
        return _svg(fig, prefix, title, alt)


def _over_time(ax: Axes, xlabel: str, ylabel: str,
               legend: Literal["upper left", "upper right"], *, ncol: int = 1) -> None:  # fmt: skip
    """The labels, legend and grid of a plot over time (the window, or since a change)."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(loc=legend, fontsize=8, frameon=True, framealpha=0.9, ncol=ncol)
    ax.grid(color="#dddddd", linewidth=0.5)


SAMPLES_NOTE = (
    "Counters sampled every 15–60 s average sub-second bursts away: the kernel "
    "throttles within 100 ms periods, so the limit must sit above these lines."
)
"""Written on the usage plot (text for the plot, not from the cluster)."""


def _hours(points: list[float], end: float) -> list[float]:
    return [(t - end) / 3600 for t in points]


def usage_plot(c: Container, *, prefix: str, title: str, alt: str) -> Plot | None:
    """CPU used per pod over the window (mean and busiest pod), with today's and the
    recommended limit; None without the series."""
    points = c.usage_series
    if len(points) < 2:
        return None
    with mpl.rc_context(_RC):
        fig = Figure(figsize=(_SIZE[0], _SIZE[1] * 0.95))
        fig.subplots_adjust(left=0.1, right=0.98, top=0.95, bottom=0.3)
        ax = fig.add_subplot()
        hours = _hours([p.t for p in points], points[-1].t)
        ax.plot(hours, [p.peak for p in points], color=INK, linewidth=1.2,
                label="busiest pod")  # fmt: skip
        ax.plot(hours, [p.cores for p in points], color=BELOW, linewidth=1.4,
                label="mean per pod")  # fmt: skip
        top = max(p.peak for p in points)
        now = c.current.limit_millicores
        if now is not None:
            ax.axhline(now / 1000, color=TODAY, linestyle="--", linewidth=1.6,
                       label=f"today's limit {now / 1000:g} cores")  # fmt: skip
            top = max(top, now / 1000)
        rec = c.recommendation
        if rec is not None and rec.limit_millicores is not None:
            ax.axhline(rec.limit_millicores / 1000, color=RECOMMENDED, linewidth=1.8,
                       label=f"recommended {rec.limit_millicores / 1000:g} cores")  # fmt: skip
            top = max(top, rec.limit_millicores / 1000)
        ax.set_ylim(0, top * 1.15 or 1.0)
        _over_time(
            ax, "hours before the end of the window", "CPU used (cores)", "upper left", ncol=2
        )
        fig.text(0.01, 0.02, SAMPLES_NOTE, fontsize=7.5, wrap=True)
        return _svg(fig, prefix, title, alt)


def applied_plot(series: tuple[Point, ...], *, at: float, after_from: float | None,
                 target: float, prefix: str, title: str, alt: str) -> Plot | None:  # fmt: skip
    """The throttle ratio before (vermillion) and after (blue) a change, the change marked;
    None without two points."""
    if len(series) < 2:
        return None
    with mpl.rc_context(_RC):
        fig = Figure(figsize=(_SIZE[0], _SIZE[1] * 0.85))
        fig.subplots_adjust(left=0.1, right=0.98, top=0.93, bottom=0.2)
        ax = fig.add_subplot()
        before = [p for p in series if p.t <= at]
        after = [p for p in series if p.t > at]
        if before:
            ax.plot(_hours([p.t for p in before], at), [p.ratio * 100 for p in before],
                    color=TODAY, linewidth=1.5, label="before")  # fmt: skip
        if after:
            ax.plot(_hours([p.t for p in after], at), [p.ratio * 100 for p in after],
                    color=RECOMMENDED, linewidth=1.5, label="after")  # fmt: skip
        ax.axvline(0, color=INK, linestyle=":", linewidth=1.4, label="the change")
        if after_from is not None and after_from > at:
            ax.axvline((after_from - at) / 3600, color=INK, linestyle="-.", linewidth=1.0,
                       label="verification starts")  # fmt: skip
        ax.axhline(target * 100, color=INK, linestyle="--", linewidth=1.0,
                   label=f"target {target * 100:g} %")  # fmt: skip
        ax.set_ylim(bottom=0)
        _over_time(ax, "hours since the change", "throttled (%)", "upper right")
        return _svg(fig, prefix, title, alt)
