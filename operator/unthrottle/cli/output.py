"""How run figures are shown: a rich table for people, JSON lines for programs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from unthrottle.cfs.figures import RunFigures
from unthrottle.model.scenario import Scenario


def scenario_json(scenario: Scenario, runs: Sequence[RunFigures]) -> dict[str, Any]:
    """The ``{"name", "runs": [...]}`` object of one scenario."""
    return {"name": scenario.name, "runs": [r.to_json() for r in runs]}


def print_json(scenario: Scenario, runs: Sequence[RunFigures]) -> None:
    """One JSON object per scenario, on one line (JSON Lines)."""
    print(json.dumps(scenario_json(scenario, runs)), flush=True)


def figures_table(title: str, rows: Sequence[tuple[Scenario, Sequence[RunFigures]]]) -> Table:
    """A table of every run of every scenario."""
    table = Table(title=title, title_justify="left")
    for header in ("scenario", "run"):
        table.add_column(header, no_wrap=True)
    for header in ("p50 ms", "p95 ms", "p99 ms", "max ms", "wall ms"):
        table.add_column(header, justify="right")
    for header in ("periods", "throttled", "ratio", "throttled ms", "bursts", "burst ms"):
        table.add_column(header, justify="right")
    for scenario, runs in rows:
        for index, (spec, fig) in enumerate(zip(scenario.runs, runs, strict=True)):
            table.add_row(
                scenario.name if index == 0 else "",
                spec.label(),
                f"{fig.latency.p50:.1f}",
                f"{fig.latency.p95:.1f}",
                f"{fig.latency.p99:.1f}",
                f"{fig.latency.max:.1f}",
                f"{fig.wall_ms:.0f}",
                str(fig.stat.nr_periods),
                str(fig.stat.nr_throttled),
                f"{fig.stat.throttle_ratio:.2f}",
                f"{fig.stat.throttled_us / 1000:.0f}",
                str(fig.stat.nr_bursts),
                f"{fig.stat.burst_us / 1000:.0f}",
            )
        table.add_section()
    return table


def print_table(title: str, rows: Sequence[tuple[Scenario, Sequence[RunFigures]]]) -> None:
    """Print the table to stdout."""
    console = Console()
    console.width = max(console.width, 180)  # the table is wide; let it be
    console.print(figures_table(title, rows))
